# Fan-out: fork several children of one warm snapshot at once and give each its own work.
# expect: /^child 0: 0$/m
# expect: /^child 2: 4$/m
# expect: /^isolated: True$/m
import os

from forkd import fork

children = fork(os.environ.get("FORKD_SNAPSHOT", "default"), 3)
try:
    for i, child in enumerate(children):
        print("child %d: %s" % (i, child.run_code("%d ** 2" % i).text))
    children[0].files.write("/root/mine.txt", "only in child 0")
    print("isolated:", [c.files.exists("/root/mine.txt") for c in children] == [True, False, False])
finally:
    for child in children:
        child.kill()
