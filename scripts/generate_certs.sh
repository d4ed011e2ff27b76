#!/usr/bin/env bash
# Generate the TLS and SuperNode-authentication credentials for a Flower 1.41 deployment
# (docker-compose.tls.yml, or flower-superlink / flower-supernode started by hand).
#
# Usage: scripts/generate_certs.sh [--out DIR] [--nodes N] [--days DAYS] [--san NAME]...
#                                  [--owner UID[:GID]] [--keygen auto|ssh-keygen|python] [--force]
#
# Writes into DIR (default ./certs):
#   ca.key, ca.crt           a private CA (EC P-256). ca.crt goes to SuperNodes
#                            (--root-certificates), SuperExecs and the flwr CLI (root-certificates).
#   server.key, server.pem   the SuperLink's certificate, signed by the CA, for
#                            --ssl-ca-certfile ca.crt --ssl-certfile server.pem --ssl-keyfile server.key.
#                            Subject alternative names: DNS localhost, DNS superlink (the compose
#                            service), IP 127.0.0.1, IP ::1, and every --san NAME (DNS or IP).
#   supernode-K.key          SuperNode K's authentication key (K = 1..N): ECDSA P-384 (SECP384R1)
#                            in OpenSSH private-key format, for
#                            flower-supernode --auth-supernode-private-key supernode-K.key
#   supernode-K.pub          its OpenSSH public key, for `flwr supernode register supernode-K.pub <conn>`
#   roster.pub               every supernode-K.pub, one per line: the federation's roster for secure
#                            aggregation (node config secagg-roster; each node signs with its
#                            supernode-K.key as identity-key: common/secagg/identity.py)
#
# Every node key is made here, on the operator's machine: for tests and trials on one host. Whoever
# runs this holds every node's identity and can sign for any node, so a secure-aggregation run with
# these keys holds only against parties other than them. In a federation of separate data owners
# each owner makes their own keys (fedlora node keygen; ssh-keygen -t ecdsa -b 384 for the SuperNode
# key), sends only the public lines, and checks the roster with the others: give --nodes 0 here
# (CA and SuperLink certificate only) and see docs/deployment.md, "Node identities and the roster".
#
# Private keys are mode 0600, the rest 0644. The Flower images run as uid 49999: --owner 49999
# hands the SuperLink and SuperNode private keys to that user (needs root, e.g. via sudo), or run
# `sudo chown 49999 DIR/server.key DIR/supernode-*.key` afterwards.
#
# Existing files are never overwritten unless --force is given; without it the script exits 1
# and changes nothing. Files are written to a temporary folder inside DIR first and moved into
# place only when every step has succeeded.
#
# Needs openssl, and ssh-keygen or a Python with the `cryptography` package (flwr depends on it,
# so the project's .venv has it) for the OpenSSH-format node keys.
set -euo pipefail

out="certs"
nodes=3
days=825
force=0
owner=""
keygen="auto"
extra_sans=()

die() {
    echo "generate_certs.sh: $*" >&2
    exit 1
}

usage() {
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
}

while [[ $# -gt 0 ]]; do
    case "$1" in
        -o | --out) out="${2:?--out needs a directory}"; shift 2 ;;
        -n | --nodes) nodes="${2:?--nodes needs a number}"; shift 2 ;;
        --days) days="${2:?--days needs a number}"; shift 2 ;;
        --san) extra_sans+=("${2:?--san needs a DNS name or IP address}"); shift 2 ;;
        --owner) owner="${2:?--owner needs UID[:GID]}"; shift 2 ;;
        --keygen) keygen="${2:?--keygen needs auto, ssh-keygen or python}"; shift 2 ;;
        -f | --force) force=1; shift ;;
        -h | --help) usage; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done

[[ "$nodes" =~ ^[0-9]+$ ]] || die "--nodes must be a non-negative integer, got '$nodes'"
[[ "$days" =~ ^[1-9][0-9]*$ ]] || die "--days must be a positive integer, got '$days'"
command -v openssl >/dev/null || die "openssl not found; install it (Debian/Ubuntu: apt-get install openssl)"

# --- how to write OpenSSH-format EC keys -----------------------------------------------------
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python_with_cryptography() {
    local py
    for py in "${PYTHON:-}" "$repo_root/.venv/bin/python" python3; do
        [[ -n "$py" ]] && command -v "$py" >/dev/null 2>&1 \
            && "$py" -c "import cryptography" >/dev/null 2>&1 && { echo "$py"; return 0; }
    done
    return 1
}
case "$keygen" in
    auto)
        if command -v ssh-keygen >/dev/null; then
            keygen="ssh-keygen"
        elif python_bin="$(python_with_cryptography)"; then
            keygen="python"
        else
            die "need ssh-keygen (openssh-client) or a Python with 'cryptography' (run 'make install') for the node keys"
        fi
        ;;
    ssh-keygen) command -v ssh-keygen >/dev/null || die "ssh-keygen not found" ;;
    python) python_bin="$(python_with_cryptography)" || die "no Python with 'cryptography' found (set PYTHON=...)" ;;
    *) die "--keygen must be auto, ssh-keygen or python, got '$keygen'" ;;
esac

# --- refuse to overwrite ------------------------------------------------------------------------
targets=(ca.key ca.crt server.key server.pem)
for ((k = 1; k <= nodes; k++)); do
    targets+=("supernode-$k.key" "supernode-$k.pub")
done
[[ $nodes -gt 0 ]] && targets+=(roster.pub)
if [[ $force -eq 0 ]]; then
    existing=()
    for f in "${targets[@]}"; do
        [[ -e "$out/$f" ]] && existing+=("$out/$f")
    done
    if [[ ${#existing[@]} -gt 0 ]]; then
        echo "generate_certs.sh: refusing to overwrite existing files (use --force to replace them):" >&2
        printf '  %s\n' "${existing[@]}" >&2
        exit 1
    fi
fi

mkdir -p "$out"
umask 077
tmp="$(mktemp -d "$out/.generate_certs.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

# --- CA -----------------------------------------------------------------------------------------
# Extensions satisfy strict verifiers too (Python >= 3.13 sets VERIFY_X509_STRICT): critical
# basicConstraints and keyUsage on the CA, key identifiers on both certificates.
cat >"$tmp/openssl.cnf" <<'EOF'
[req]
distinguished_name = dn
prompt = no
[dn]
CN = placeholder
[ca_ext]
basicConstraints = critical, CA:TRUE, pathlen:0
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
EOF
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$tmp/ca.key" 2>/dev/null
openssl req -new -x509 -config "$tmp/openssl.cnf" -key "$tmp/ca.key" -sha256 -days "$days" \
    -subj "/O=fedlora-dp/CN=fedlora-dp federation CA" -extensions ca_ext -out "$tmp/ca.crt"

# --- SuperLink server certificate -----------------------------------------------------------
sans="DNS:localhost,DNS:superlink,IP:127.0.0.1,IP:::1"
for san in "${extra_sans[@]+"${extra_sans[@]}"}"; do
    if [[ "$san" =~ ^[0-9.]+$ || "$san" == *:* ]]; then
        sans+=",IP:$san"
    else
        sans+=",DNS:$san"
    fi
done
cat >"$tmp/server_ext.cnf" <<EOF
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
subjectAltName = $sans
EOF
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$tmp/server.key" 2>/dev/null
openssl req -new -config "$tmp/openssl.cnf" -key "$tmp/server.key" -sha256 \
    -subj "/O=fedlora-dp/CN=superlink" -out "$tmp/server.csr"
openssl x509 -req -in "$tmp/server.csr" -CA "$tmp/ca.crt" -CAkey "$tmp/ca.key" \
    -set_serial "0x$(openssl rand -hex 16)" -days "$days" -sha256 \
    -extfile "$tmp/server_ext.cnf" -out "$tmp/server.pem" 2>/dev/null
openssl verify -CAfile "$tmp/ca.crt" "$tmp/server.pem" >/dev/null \
    || die "the new server certificate does not verify against the new CA"

# --- SuperNode authentication keys (ECDSA P-384, OpenSSH format) -----------------------------
for ((k = 1; k <= nodes; k++)); do
    key="$tmp/supernode-$k.key"
    if [[ "$keygen" == "ssh-keygen" ]]; then
        ssh-keygen -q -t ecdsa -b 384 -N "" -C "fedlora-dp supernode-$k" -f "$key"
        mv "$key.pub" "$tmp/supernode-$k.pub"
    else
        "$python_bin" - "$key" "$tmp/supernode-$k.pub" "fedlora-dp supernode-$k" <<'EOF'
import sys
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

key_path, pub_path, comment = sys.argv[1:4]
key = ec.generate_private_key(ec.SECP384R1())
with open(key_path, "wb") as fh:
    fh.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                               serialization.NoEncryption()))
pub = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
with open(pub_path, "wb") as fh:
    fh.write(pub + b" " + comment.encode() + b"\n")
EOF
    fi
done

# --- the secure-aggregation roster: every node's public key, in node order ----------------------
if [[ $nodes -gt 0 ]]; then
    for ((k = 1; k <= nodes; k++)); do
        cat "$tmp/supernode-$k.pub"
    done >"$tmp/roster.pub"
fi

# --- permissions, ownership, move into place ---------------------------------------------------
for f in "${targets[@]}"; do
    case "$f" in
        *.key) chmod 600 "$tmp/$f" ;;
        *) chmod 644 "$tmp/$f" ;;
    esac
done
if [[ -n "$owner" ]]; then
    for f in "${targets[@]}"; do
        [[ "$f" == *.key && "$f" != ca.key ]] && chown "$owner" "$tmp/$f"
    done
fi
for f in "${targets[@]}"; do
    mv -f "$tmp/$f" "$out/$f"
done

echo "Wrote to $out/: CA (ca.crt, ca.key), SuperLink certificate (server.pem, server.key; SAN $sans)"
if [[ $nodes -gt 0 ]]; then
    echo "and $nodes SuperNode key pairs (supernode-1..$nodes .key/.pub, ECDSA P-384, OpenSSH format)."
    echo "Register them once the SuperLink runs with --enable-supernode-auth, e.g.:"
    echo "  flwr supernode register $out/supernode-1.pub <connection>"
    echo "roster.pub lists them all: the secure-aggregation roster (node config secagg-roster)."
    echo "These node keys were made here, so whoever holds $out/ can sign for every node: for tests and"
    echo "local trials only. Separate data owners make their own (fedlora node keygen; docs/deployment.md)."
fi
echo "Keep ca.key offline; only ca.crt is needed by nodes and the flwr CLI."
