/* The guest's one network interface, configured once at boot from the kernel command line.
 *
 *   forkd.net=ADDR/PREFIX,GATEWAY,DNS,GATEWAY-MAC     e.g. 10.0.2.15/24,10.0.2.2,10.0.2.3,52:55:0a:00:02:02
 *
 * Every child of a snapshot inherits this configuration (same address in every child); the host
 * gives each child its own backend for the same device (src/net/). The host decides what is
 * reachable: this only makes the guest's side predictable:
 *   - static ARP entries for the gateway and the DNS address, so a child's neighbour cache never
 *     holds a MAC learnt under another backend (a branch of a child keeps its cache);
 *   - routes over a link without carrier are ignored, so with the link down (network "none")
 *     connect() fails at once (ENETUNREACH) instead of timing out;
 *   - no IPv6 on the interface (the host's policies are IPv4).
 * Absent the option or the interface, nothing is done. Failures are logged, never fatal. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <net/if_arp.h>
#include <net/route.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"

#define IFNAME "eth0"

struct netcfg {
	struct in_addr addr, mask, gw, dns;
	unsigned char gwmac[6];
};

static int write_str(const char *path, const char *s)
{
	int fd = open(path, O_WRONLY | O_TRUNC | O_CREAT | O_CLOEXEC, 0644);
	if (fd < 0)
		return -1;
	size_t n = strlen(s);
	ssize_t w = write(fd, s, n);
	int e = errno;
	close(fd);
	errno = e;
	return w == (ssize_t)n ? 0 : -1;
}

/* Parses "ADDR/PREFIX,GW,DNS,MAC": 0, or -1 if malformed. */
static int parse(const char *v, struct netcfg *c)
{
	char a[32], g[32], d[32];
	unsigned prefix, m[6];
	char extra;
	if (sscanf(v, "%31[0-9.]/%u,%31[0-9.],%31[0-9.],%x:%x:%x:%x:%x:%x%c", a, &prefix, g, d, &m[0],
		   &m[1], &m[2], &m[3], &m[4], &m[5], &extra) != 10)
		return -1;
	if (prefix < 1 || prefix > 30 || !inet_aton(a, &c->addr) || !inet_aton(g, &c->gw) ||
	    !inet_aton(d, &c->dns))
		return -1;
	c->mask.s_addr = htonl(~0u << (32 - prefix));
	for (int i = 0; i < 6; i++) {
		if (m[i] > 255)
			return -1;
		c->gwmac[i] = (unsigned char)m[i];
	}
	return 0;
}

/* The value of forkd.net= on the kernel command line, or NULL. */
static char *cmdline_net(void)
{
	static char buf[4096];
	int fd = open("/proc/cmdline", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	ssize_t n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0)
		return NULL;
	buf[n] = 0;
	for (char *tok = strtok(buf, " \n"); tok; tok = strtok(NULL, " \n"))
		if (!strncmp(tok, "forkd.net=", 10))
			return tok + 10;
	return NULL;
}

static void set_sin(struct sockaddr *sa, struct in_addr a)
{
	struct sockaddr_in *sin = (struct sockaddr_in *)sa;
	memset(sin, 0, sizeof *sin);
	sin->sin_family = AF_INET;
	sin->sin_addr = a;
}

static int static_arp(int s, struct in_addr ip, const unsigned char mac[6])
{
	struct arpreq r;
	memset(&r, 0, sizeof r);
	set_sin(&r.arp_pa, ip);
	r.arp_ha.sa_family = ARPHRD_ETHER;
	memcpy(r.arp_ha.sa_data, mac, 6);
	r.arp_flags = ATF_PERM | ATF_COM;
	strcpy(r.arp_dev, IFNAME);
	return ioctl(s, SIOCSARP, &r);
}

void net_setup(void)
{
	const char *v = cmdline_net();
	if (!v)
		return;
	struct netcfg c;
	if (parse(v, &c) < 0) {
		logmsg("net: malformed forkd.net=%s", v);
		return;
	}
	if (if_nametoindex(IFNAME) == 0) {
		logmsg("net: no %s (forkd.net given): %s", IFNAME, strerror(errno));
		return;
	}
	write_str("/proc/sys/net/ipv6/conf/" IFNAME "/disable_ipv6", "1");
	int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (s < 0) {
		logmsg("net: socket: %s", strerror(errno));
		return;
	}
	struct ifreq ifr;
	struct rtentry rt;
	const char *step = NULL;
	memset(&ifr, 0, sizeof ifr);
	strcpy(ifr.ifr_name, IFNAME);
	set_sin(&ifr.ifr_addr, c.addr);
	if (ioctl(s, SIOCSIFADDR, &ifr) < 0) {
		step = "SIOCSIFADDR";
		goto out;
	}
	set_sin(&ifr.ifr_netmask, c.mask);
	if (ioctl(s, SIOCSIFNETMASK, &ifr) < 0) {
		step = "SIOCSIFNETMASK";
		goto out;
	}
	if (ioctl(s, SIOCGIFFLAGS, &ifr) < 0) {
		step = "SIOCGIFFLAGS";
		goto out;
	}
	ifr.ifr_flags |= IFF_UP;
	if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0) {
		step = "SIOCSIFFLAGS";
		goto out;
	}
	/* Before the gateway route: with them, the route needs the gateway resolved. */
	if (static_arp(s, c.gw, c.gwmac) < 0 || static_arp(s, c.dns, c.gwmac) < 0) {
		step = "SIOCSARP";
		goto out;
	}
	memset(&rt, 0, sizeof rt);
	set_sin(&rt.rt_dst, (struct in_addr){ 0 });
	set_sin(&rt.rt_genmask, (struct in_addr){ 0 });
	set_sin(&rt.rt_gateway, c.gw);
	rt.rt_flags = RTF_UP | RTF_GATEWAY;
	rt.rt_dev = (char *)IFNAME;
	if (ioctl(s, SIOCADDRT, &rt) < 0 && errno != EEXIST) {
		step = "SIOCADDRT";
		goto out;
	}
	/* After the route is in: a route over a link without carrier would not be added. */
	if (write_str("/proc/sys/net/ipv4/conf/" IFNAME "/ignore_routes_with_linkdown", "1") < 0)
		logmsg("net: ignore_routes_with_linkdown: %s", strerror(errno));
	char line[64];
	snprintf(line, sizeof line, "nameserver %s\n", inet_ntoa(c.dns));
	if (write_str("/etc/resolv.conf.forkd-tmp", line) < 0 ||
	    rename("/etc/resolv.conf.forkd-tmp", "/etc/resolv.conf") < 0)
		logmsg("net: /etc/resolv.conf: %s", strerror(errno));
out:
	if (step)
		logmsg("net: %s: %s", step, strerror(errno));
	close(s);
}

/* Waits (at most timeout_ms) until eth0 reports carrier: after a fork the host sets the link up
 * while the VM is paused, and the guest handles that in a kernel worker soon after it runs.
 * 0 once up; -1 (errno ETIMEDOUT, or why it cannot be read) otherwise. */
int net_wait_up(int64_t timeout_ms)
{
	int64_t deadline = now_ms() + timeout_ms;
	for (;;) {
		char st[16] = "";
		int fd = open("/sys/class/net/" IFNAME "/operstate", O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			return -1;
		ssize_t n = read(fd, st, sizeof st - 1);
		close(fd);
		if (n > 0 && !strncmp(st, "up", 2))
			return 0;
		if (now_ms() >= deadline) {
			errno = ETIMEDOUT;
			return -1;
		}
		struct timespec ts = { .tv_sec = 0, .tv_nsec = 1000000 };
		nanosleep(&ts, NULL);
	}
}
