#!/usr/bin/env bash
# A local CA and certificates for trying TLS and mTLS on one machine or a lab network:
#   deploy/make-test-certs.sh DIR [SERVER_NAME ...]
# writes DIR/ca.pem (+ ca.key), DIR/server.pem + server.key for 127.0.0.1, localhost and
# every SERVER_NAME given (host names or IP addresses), and DIR/client.pem + client.key.
#
#   specfleet coordinator serve --tls-cert DIR/server.pem --tls-key DIR/server.key \
#       [--tls-client-ca DIR/ca.pem]                      # the last flag requires client certs
#   specfleet agent enrol ... --tls-ca DIR/ca.pem [--tls-cert DIR/client.pem --tls-key DIR/client.key]
#
# For testing only: a real deployment gets its certificates from its own CA.
set -euo pipefail

if [ "$#" -lt 1 ]; then
    echo "usage: $0 DIR [SERVER_NAME ...]" >&2
    exit 2
fi
dir="$1"
shift
days=825
mkdir -p "$dir"
umask 077

san="DNS:localhost,IP:127.0.0.1"
for name in "$@"; do
    if [[ "$name" =~ ^[0-9.]+$ || "$name" == *:* ]]; then
        san="$san,IP:$name"
    else
        san="$san,DNS:$name"
    fi
done

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

key "$dir/ca.key"
openssl req -x509 -new -key "$dir/ca.key" -sha256 -days "$days" -subj "/CN=specfleet test CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "$dir/ca.pem"

issue() {  # issue NAME COMMON_NAME EXTENSIONS
    local name="$1" cn="$2" ext="$3"
    key "$dir/$name.key"
    openssl req -new -key "$dir/$name.key" -subj "/CN=$cn" -out "$dir/$name.csr"
    printf '%b' "$ext" >"$dir/$name.ext"
    openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" -CAcreateserial \
        -days "$days" -sha256 -extfile "$dir/$name.ext" -out "$dir/$name.pem" 2>/dev/null
    rm -f "$dir/$name.csr" "$dir/$name.ext"
}

issue server "specfleet coordinator" \
    "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName=$san\n"
issue client "specfleet agent" \
    "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n"
rm -f "$dir/ca.srl"
chmod 644 "$dir"/*.pem
echo "certificates in $dir: ca.pem, server.pem/server.key ($san), client.pem/client.key"
