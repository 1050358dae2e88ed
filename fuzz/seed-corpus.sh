#!/bin/sh
# Seed the fuzz corpora from golden/ (run from the repository root after `cargo build`):
#   check_bytes     every YAML/JSON file under golden/ up to 256 KiB
#   cluster_config  the golden files that hold a ClusterConfig or a KubeProxyConfiguration
#   lock_file       the lock file `--write-lock` writes for each golden case
#   cluster         32 fixed pseudo-random byte strings (the generator reads any bytes)
# Names are content hashes, so running it twice adds nothing.
set -eu
bin=${SVC_COMPILE:-target/debug/svc-compile}
c=fuzz/corpus
mkdir -p "$c/check_bytes" "$c/cluster_config" "$c/lock_file" "$c/cluster"
add() { # add DIR FILE
    h=$(sha1sum "$2" | cut -c1-16)
    cp "$2" "$1/$h"
}
find golden -type f \( -name '*.yaml' -o -name '*.yml' -o -name '*.json' \) -size -256k |
    sort | while read -r f; do
        add "$c/check_bytes" "$f"
        if grep -q 'kind: *ClusterConfig\|kind: *KubeProxyConfiguration' "$f"; then
            add "$c/cluster_config" "$f"
        fi
    done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for d in golden/cases/*/; do
    rm -f "$tmp/lock.yaml"
    # shellcheck disable=SC2046 # args holds several words on purpose
    "$bin" check "$d" $(cat "$d/args" 2>/dev/null | sed 's/--node [^ ]*//') \
        --lock "$tmp/lock.yaml" --write-lock >/dev/null 2>&1 || true
    [ -s "$tmp/lock.yaml" ] && add "$c/lock_file" "$tmp/lock.yaml"
done
i=0
while [ $i -lt 32 ]; do
    j=0
    : >"$tmp/bytes"
    while [ $j -lt 8 ]; do
        printf 'seed %s %s' $i $j | sha512sum | cut -c1-128 | xxd -r -p >>"$tmp/bytes"
        j=$((j + 1))
    done
    add "$c/cluster" "$tmp/bytes"
    i=$((i + 1))
done
for t in check_bytes cluster_config lock_file cluster; do
    echo "$t: $(ls "$c/$t" | wc -l) files"
done
