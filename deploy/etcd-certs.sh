#!/usr/bin/env bash
# Makes the certificates of an etcd cluster that speaks TLS and takes only clients holding a
# certificate of its own CA (--client-cert-auth): forkd's nodes and gateways reach it as
# etcds:// with FORKD_CLUSTER_CA, FORKD_CLUSTER_CERT and FORKD_CLUSTER_KEY. Nothing else can
# read or write the cluster's state, not even a sandbox whose packets leave through a node.
#
#   deploy/etcd-certs.sh OUT_DIR [HOST_NAME_OR_IP...]
#
#   OUT_DIR/server/  ca.crt server.crt server.key  for the etcd members (serving and peer)
#   OUT_DIR/client/  ca.crt client.crt client.key  for forkd's nodes and gateways
#   OUT_DIR/ca.key   the CA's key: only needed to make more certificates; keep it offline
#
# The members' certificate names the Kubernetes members (etcd-0.etcd ... etcd-2.etcd in the
# namespace FORKD_NAMESPACE, default forkd), localhost and 127.0.0.1, and every host name or
# address given (plain hosts' members). EC P-256 keys; FORKD_CERT_DAYS (825) of validity.
set -euo pipefail
out=${1:?usage: etcd-certs.sh OUT_DIR [HOST_NAME_OR_IP...]}
shift
ns=${FORKD_NAMESPACE:-forkd}
days=${FORKD_CERT_DAYS:-825}
[ ! -e "$out/ca.key" ] || { echo "etcd-certs: $out already has a CA; not overwriting it" >&2; exit 1; }
umask 077
mkdir -p "$out/server" "$out/client"

sans="DNS:localhost,IP:127.0.0.1"
for i in 0 1 2; do
  sans+=",DNS:etcd-$i.etcd,DNS:etcd-$i.etcd.$ns.svc,DNS:etcd-$i.etcd.$ns.svc.cluster.local"
done
for n in "$@"; do
  if [[ $n =~ ^[0-9.]+$ || $n == *:* ]]; then sans+=",IP:$n"; else sans+=",DNS:$n"; fi
done

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1"; }
serial() { echo "0x$(openssl rand -hex 16)"; }

key "$out/ca.key"
openssl req -x509 -new -key "$out/ca.key" -subj "/CN=forkd etcd CA" -days "$days" -set_serial "$(serial)" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" -out "$out/ca.crt"

# sign PATH_WITHOUT_SUFFIX COMMON_NAME EXTENSIONS
sign() {
  key "$1.key"
  openssl req -new -key "$1.key" -subj "/CN=$2" -out "$1.csr"
  openssl x509 -req -in "$1.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" -set_serial "$(serial)" \
    -days "$days" -extfile <(printf '%s\n' "$3") -out "$1.crt" 2>/dev/null
  rm "$1.csr"
}
# Members serve clients and authenticate to each other with the same certificate.
sign "$out/server/server" "etcd" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=$sans"
sign "$out/client/client" "forkd" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth"
cp "$out/ca.crt" "$out/server/ca.crt"
cp "$out/ca.crt" "$out/client/ca.crt"
chmod 0644 "$out/ca.crt" "$out/server/ca.crt" "$out/client/ca.crt" "$out/server/server.crt" "$out/client/client.crt"
echo "etcd-certs: made $out/server (etcd members) and $out/client (forkd's nodes and gateways); keep $out/ca.key offline"
