# A web server in a sandbox, reached from the host. The sandbox has its own network namespace
# with egress denied (it can reach nothing outside), and get_host() exposes its port on the
# host. It also runs under limits: host memory, half a core, disk written, and a lifetime.
# expect: /^status: 200$/m
# expect: /^body: hello from sb-/m
# expect: /^limits: 768 0\.5 256 600000$/m
# expect: /^egress: deny$/m
import json
import time
import urllib.request

from forkd import Sandbox

sb = Sandbox(
    network={"mode": "netns", "egress": {"mode": "deny"}},
    limits={"memory_mib": 768, "cpus": 0.5, "disk_mib": 256, "lifetime_ms": 600_000},
)
try:
    sb.files.write("/root/www/index.html", "hello from " + sb.sandbox_id)
    sb.commands.run("cd /root/www && exec python3 -m http.server 8000", background=True)
    host = sb.get_host(8000)  # exposes the port: "127.0.0.1:NNNNN"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # straight to it
    for attempt in range(150):
        try:
            with opener.open("http://%s/index.html" % host, timeout=5) as r:
                print("status:", r.status)
                print("body:", r.read().decode())
            break
        except OSError:
            time.sleep(0.2)  # the server is still starting
    info = sb.get_info()
    lim = info.limits
    print("limits:", lim["memory_mib"], lim["cpus"], lim["disk_mib"], lim["lifetime_ms"])
    print("egress:", info.network["egress"]["mode"])
    print(json.dumps(info.network["ports"]))
finally:
    sb.kill()
