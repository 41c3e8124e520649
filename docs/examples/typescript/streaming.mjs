// Streaming output and background commands: callbacks fire as output arrives; a background
// command gets a handle to feed its stdin, wait for it, or kill it.
// expect: /^line 1$/m
// expect: /^line 3$/m
// expect: /^echoed: ping$/m
// expect: /^killed: true$/m
import { CommandExitError, Sandbox } from "@forkd/sdk";

const sandbox = await Sandbox.create();
try {
  await sandbox.commands.run("for i in 1 2 3; do echo line $i; sleep 0.2; done", {
    onStdout: (data) => process.stdout.write(data),
  });

  const cat = await sandbox.commands.run("cat", { background: true, stdin: true });
  await cat.sendStdin("ping");
  await cat.closeStdin();
  console.log(`echoed: ${(await cat.wait()).stdout}`);

  const server = await sandbox.commands.run("sleep 3600", { background: true, timeoutMs: 0 });
  await server.kill();
  try {
    await server.wait();
  } catch (e) {
    console.log(`killed: ${e instanceof CommandExitError && e.result.signal === 9}`);
  }
} finally {
  await sandbox.kill();
}
