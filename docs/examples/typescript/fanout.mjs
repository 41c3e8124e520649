// Fan-out: fork several children of one warm snapshot at once and give each its own work.
// Each child is its own VM with its own disk: what one writes, the others never see.
// expect: /^child 0: 0$/m
// expect: /^child 1: 1$/m
// expect: /^child 2: 4$/m
// expect: /^isolated: true$/m
import { fork } from "@forkd/sdk";

const snapshot = process.env.FORKD_SNAPSHOT ?? "default";
const children = await fork(snapshot, 3);
try {
  const squares = await Promise.all(children.map((c, i) => c.runCode(`${i} ** 2`)));
  squares.forEach((s, i) => console.log(`child ${i}: ${s.text}`));

  await children[0].files.write("/root/mine.txt", "only in child 0");
  const seen = await Promise.all(children.map((c) => c.files.exists("/root/mine.txt")));
  console.log(`isolated: ${seen.join(",") === "true,false,false"}`);
} finally {
  await Promise.all(children.map((c) => c.kill()));
}
