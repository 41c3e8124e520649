# A Debian-based etcd 3.4 image for deploy/kubernetes/etcd.yaml: Debian 12's own etcd-server
# (3.4.23), the etcd the design names, with its user at a fixed uid/gid (2379) so the
# StatefulSet can run it as that user on its volume. Operator-provided and replaceable: any
# etcd 3.4 or later image with /usr/bin/etcd works (set its uid in etcd.yaml), and an external
# etcd cluster works without it (docs/cluster.md "Deployment").
#   docker build -f deploy/etcd.Dockerfile -t REGISTRY/forkd-etcd:3.4.23 deploy
FROM debian:12
RUN groupadd --system --gid 2379 etcd \
 && useradd --system --uid 2379 --gid etcd --home-dir /var/lib/etcd --shell /usr/sbin/nologin etcd \
 && apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends etcd-server etcd-client >/dev/null \
 && rm -rf /var/lib/apt/lists/* \
 && install -d -o etcd -g etcd -m 0700 /var/lib/etcd
USER etcd
EXPOSE 2379 2380
ENTRYPOINT ["/usr/bin/etcd"]
