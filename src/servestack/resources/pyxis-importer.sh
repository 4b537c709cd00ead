#!/bin/bash
# pyxis importer (installed by servestack.cluster.pyxis; @NAME@ are filled in then): `get docker://URI` imports the image once per digest
# into a squashfs under CACHE and prints its path; later jobs reuse it. Images are referenced by
# digest everywhere past the build, so the digest in the URI is the cache key.
set -euo pipefail
export PATH=@ENROOT_BIN@:$PATH
cache=@CACHE@
keep=@KEEP@
case "$1" in
    get)
        uri=$2
        digest=${uri##*@}
        [[ $digest == sha256:* && ${#digest} -eq 71 ]] || { echo "pyxis importer: $uri is not an image by digest" >&2; exit 1; }
        out=$cache/${digest#sha256:}.sqsh
        mkdir -p "$cache"
        if [[ ! -e $out ]]; then
            exec 9>"$out.lock"
            flock 9
            if [[ ! -e $out ]]; then
                tmp=$out.$$.tmp
                trap 'rm -f "$tmp"' EXIT
                enroot import --output "$tmp" "$uri" >&2
                mv "$tmp" "$out"
                # Bounded disk: the layers are in the squashfs now, and only the newest
                # $keep images stay (a rerun of the same digest reuses its file).
                rm -rf "${ENROOT_CACHE_PATH:-@LAYERS@}"/* 2>/dev/null || true
                find "$cache" -maxdepth 1 -name '*.sqsh' -printf '%T@ %p\n' | sort -rn | tail -n +$((keep + 1)) |
                    cut -d' ' -f2- | while read -r old; do rm -f "$old" "$old.lock"; done
            fi
        fi
        touch "$out"
        echo "$out"
        ;;
    release) ;;
    *) echo "pyxis importer: unknown command $1" >&2; exit 1 ;;
esac
