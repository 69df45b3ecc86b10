#!/bin/sh
# Installs the Debian packages cartridge needs to build and test.
#
# As root it runs apt-get for whatever is missing; otherwise it prints the
# exact apt-get line to run and exits 1 when something is missing.
# Usage: scripts/setup.sh [--check]   (--check only reports, never installs)
set -eu

PACKAGES="build-essential cmake luajit libluajit-5.1-dev libopenblas-dev libcjson-dev libedit-dev lua-busted"
# Open MPI: optional for the build (without it self-study runs in one process;
# docs/scale-out.md), installed here so that the tests run self-study under
# mpirun too.
PACKAGES="$PACKAGES openmpi-bin libopenmpi-dev"
# The server tests use curl and the official openai and Anthropic npm clients as HTTP
# clients. A machine that already has node and npm (from NodeSource, say, whose
# nodejs conflicts with Debian's npm) keeps them.
command -v curl >/dev/null 2>&1 || PACKAGES="$PACKAGES curl"
command -v node >/dev/null 2>&1 || PACKAGES="$PACKAGES nodejs"
command -v npm >/dev/null 2>&1 || PACKAGES="$PACKAGES npm"

# A package counts only when it is installed for this machine's own
# architecture (or is architecture-independent): a cross package such as
# libopenblas-dev:arm64, which scripts/test-aarch64.sh installs, has no headers
# or libraries the native build can use, yet `dpkg-query -W NAME` matches it.
native=$(dpkg --print-architecture)
installed() {
    dpkg-query -W -f='${Status} ${Architecture}\n' "$1" 2>/dev/null |
        grep -Eq "^install ok installed ($native|all)\$"
}

missing=""
for pkg in $PACKAGES; do
    installed "$pkg" || missing="$missing $pkg"
done

# The openai and @anthropic-ai/sdk npm packages the server specs drive, ajv,
# the JSON Schema validator of the structured-output spec, and playwright-core,
# which drives Debian's chromium in the web page's tests (tests/node/package.json;
# without chromium those tests are pending: .ci/run installs it).
npm_client() {
    here=$(cd "$(dirname "$0")/.." && pwd)
    # package.json's majors need Node 20; on an older Node (Debian 12 ships 18) the last majors that support it
    node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
    if [ "$node_major" -ge 20 ]; then openai=6 anthropic=1 old=""; else
        openai=4 anthropic=0 old="openai@^4.104.0 @anthropic-ai/sdk@^0.39.0 ajv@^8.17.1 playwright-core@^1.49.0 --no-save"; fi
    if [ -f "$here/tests/node/node_modules/ajv/package.json" ] &&
        [ -f "$here/tests/node/node_modules/playwright-core/package.json" ] &&
        grep -q "\"version\": \"$openai\." "$here/tests/node/node_modules/openai/package.json" 2>/dev/null &&
        grep -q "\"version\": \"$anthropic\." "$here/tests/node/node_modules/@anthropic-ai/sdk/package.json" 2>/dev/null; then
        return 0
    fi
    if [ "${1:-}" = "--check" ]; then
        echo "setup: the npm clients are not installed in tests/node (scripts/setup.sh installs them)"
        return 0
    fi
    if command -v npm >/dev/null 2>&1; then
        echo "setup: installing the openai and Anthropic npm clients, ajv and playwright-core into tests/node"
        # shellcheck disable=SC2086 # $old: a list of packages, or nothing
        npm install --prefix "$here/tests/node" --no-audit --no-fund --loglevel=error $old ||
            echo "setup: npm install failed; the server specs' npm-client cases will be pending"
    fi
}

if [ -z "$missing" ]; then
    echo "setup: all dependencies are installed for $native ($PACKAGES)"
    npm_client "${1:-}"
    exit 0
fi

echo "setup: missing Debian packages (for $native):$missing"
if [ "${1:-}" = "--check" ]; then
    exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "setup: run this as root, or install them yourself with:"
    echo "  sudo apt-get update && sudo apt-get install -y$missing"
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends $missing
echo "setup: installed$missing"
npm_client
