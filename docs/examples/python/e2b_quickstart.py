# E2B's code-interpreter quick start, unchanged except for the import line
# (was: from e2b_code_interpreter import Sandbox). The test suite runs this file.
from forkd import Sandbox

sbx = Sandbox()  # By default the sandbox is alive for 5 minutes
execution = sbx.run_code("print('hello world')")  # Execute Python inside the sandbox
print(execution.logs)

files = sbx.files.list("/")
print(files)

with Sandbox() as sandbox:
    execution = sandbox.run_code("x = 1\nx += 1\nx")
    print(execution.text)  # outputs 2
sbx.kill()
