# The Python SDK in one page: fork a sandbox, run a command, a Python cell, move a file.
# The test suite runs this file (test/integration/examples.test.ts) and checks its output:
# expect: /^hello from sb-[a-z2-7]{16}$/m
# expect: /^cell: 42$/m
# expect: /^files: .*data\.csv/m
from forkd import Sandbox

with Sandbox() as sandbox:  # forks $FORKD_SNAPSHOT, else "default" (made on first use)
    r = sandbox.commands.run("echo hello from $(hostname)")
    print(r.stdout, end="")

    cell = sandbox.run_code("x = 6 * 7\nx")
    print("cell:", cell.text)

    sandbox.files.write("/root/data.csv", "a,b\n1,2\n")
    print("files:", " ".join(e.name for e in sandbox.files.list("/root")))
