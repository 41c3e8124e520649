// The TypeScript SDK in one page: fork a sandbox, run a command, a Python cell, move a file.
// The test suite runs this file (test/integration/examples.test.ts) and checks its output:
// expect: /^hello from sb-[a-z2-7]{16}$/m
// expect: /^cell: 42$/m
// expect: /^files: .*data\.csv/m
import { Sandbox } from "@forkd/sdk";

const sandbox = await Sandbox.create(); // forks $FORKD_SNAPSHOT, else "default" (made on first use)
try {
  const r = await sandbox.commands.run("echo hello from $(hostname)");
  process.stdout.write(r.stdout);

  const cell = await sandbox.runCode("x = 6 * 7\nx");
  console.log(`cell: ${cell.text}`);

  await sandbox.files.write("/root/data.csv", "a,b\n1,2\n");
  const names = (await sandbox.files.list("/root")).map((e) => e.name);
  console.log(`files: ${names.join(" ")}`);
} finally {
  await sandbox.kill();
}
