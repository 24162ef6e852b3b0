#!/usr/bin/env bash
# Installs from scratch, timed: a clean clone of this checkout's HEAD, fresh pip and uv caches (a fresh machine has
# neither; it has what lies on its disk: the CPU torch file and the local mirrors), then `make` builds the venvs the
# way a newcomer's `make demo` / `make test` or CI does. Prints one line per step and a summary, checks the venvs
# work, and removes the clone unless --keep.
#
#   bash bench/install_bench.sh                                # uv, the three venvs at once (make venvs)
#   bash bench/install_bench.sh --installer pip --jobs 1       # the fallback: pip, one venv after the other
#   bash bench/install_bench.sh --targets "install-dev engine-venv" --jobs 2   # what `make demo` installs
#   bash bench/install_bench.sh --rev eb68e49 --installer pip --jobs 1   # the Makefile before uv (pip only)
#
# With --jobs 1 each target is timed on its own; with more, the targets run under one `make -jN -O` (each
# target's output kept whole) and only the total is timed; uv's own lines split each venv's time into resolve,
# download-and-unpack ("Prepared") and link ("Installed"). Downloaded bytes are what the machine's
# non-loopback interfaces received meanwhile (other traffic on the machine counts too). The load average before
# and after is printed: on a machine shared with other work, compare runs of similar load only.
set -euo pipefail

installer=uv
jobs=3
targets="install-dev engine-venv agl1-venv"
keep=""
check=1
rev=HEAD
while [ $# -gt 0 ]; do
  case "$1" in
    --installer) installer=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --targets) targets=$2; shift 2 ;;
    --rev) rev=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    --no-check) check=""; shift ;;
    -h | --help) sed -n '2,/^set -/p' "$0" | sed -n 's/^# \{0,1\}//p'; exit 0 ;;
    *) echo "unknown option $1 (--help)" >&2; exit 2 ;;
  esac
done
case "$installer" in uv | pip) ;; *) echo "--installer uv or pip" >&2; exit 2 ;; esac

repo=$(cd "$(dirname "$0")/.." && pwd)
lab=$(mktemp -d /tmp/install-bench.XXXXXX)
cleanup() { if [ -z "$keep" ]; then rm -rf "$lab"; else echo "kept: $lab"; fi; }
trap cleanup EXIT
git clone -q "$repo" "$lab/src"
cd "$lab/src"
git checkout -q "$rev"
export PIP_CACHE_DIR="$lab/pip-cache" UV_CACHE_DIR="$lab/uv-cache"
logs="$lab/logs"
mkdir -p "$logs"

rx_bytes() { awk -F'[: ]+' 'NR > 2 && $2 != "lo" { s += $3 } END { printf "%.0f", s }' /proc/net/dev; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
load() { cut -d' ' -f1-3 /proc/loadavg; }
mib() { awk -v b="$1" 'BEGIN { printf "%.0f", b / 1048576 }'; }

echo "install bench: $(git log --oneline -1 | cut -c1-60), installer $installer, jobs $jobs, targets: $targets"
echo "machine: $(nproc) cores, load before $(load), $(date -u +%FT%TZ)"
rx0=$(rx_bytes)
t0=$(now)
if [ "$jobs" = 1 ]; then
  for t in $targets; do
    s=$(now)
    make INSTALLER="$installer" UV_OUTPUT= "$t" >"$logs/$t.log" 2>&1 || { tail -30 "$logs/$t.log"; exit 1; }
    echo "  $t: $(secs "$s" "$(now)") s"
  done
else
  make -j"$jobs" -O INSTALLER="$installer" UV_OUTPUT= $targets >"$logs/all.log" 2>&1 || { tail -40 "$logs/all.log"; exit 1; }
fi
t1=$(now)
rx1=$(rx_bytes)
total=$(secs "$t0" "$t1")
# uv's own account of each venv: resolve, download and unpack ("Prepared"), link into the venv ("Installed").
for f in "$logs"/*.log; do
  grep -E '^(Resolved|Prepared|Installed|Uninstalled) [0-9]+ packages? in' "$f" | sed "s/^/  uv ($(basename "$f" .log)): /" || true
  grep -E '^(uv not available|uv failed|could not install uv)' "$f" | sed 's/^/  FALLBACK: /' || true
done
echo "  downloaded $(mib $((rx1 - rx0))) MiB; caches: pip $(du -sm "$PIP_CACHE_DIR" 2>/dev/null | cut -f1 || echo 0) MiB," \
  "uv $(du -sm "$UV_CACHE_DIR" 2>/dev/null | cut -f1 || echo 0) MiB"
for v in .venv .venv-engine .venv-agl1; do
  [ -d "$v" ] && echo "  $v: $(du -sm "$v" | cut -f1) MiB on disk (hardlinks from the uv cache counted here)"
done

if [ -n "$check" ]; then
  # The first imports compile the bytecode uv does not write at install time (pip does): timed, as part of the bill.
  first() { local s; s=$(now); "$@" >/dev/null; echo "$(secs "$s" "$(now)") s"; }
  if [ -x .venv/bin/python ]; then
    echo "  check .venv: $(.venv/bin/python -c 'import torch; print(torch.__version__)'), first import of" \
      "torch+verl+services $(first .venv/bin/python -c 'import torch, verl, services'), second" \
      "$(first .venv/bin/python -c 'import torch, verl, services')"
    case "$(.venv/bin/python -c 'import torch; print(torch.__version__)')" in
      2.13.0+cpu) ;; *) echo "  WRONG torch in .venv" >&2; exit 1 ;;
    esac
    s=$(now)
    .venv/bin/python -m pytest -q -p no:cacheprovider tests/cli/test_agl.py >"$logs/pytest.log" 2>&1 ||
      { tail -20 "$logs/pytest.log"; exit 1; }
    echo "  check .venv: $(tail -1 "$logs/pytest.log") (tests/cli/test_agl.py, $(secs "$s" "$(now)") s)"
  fi
  if [ -x .venv-engine/bin/python ]; then
    echo "  check .venv-engine: first import of vllm $(first .venv-engine/bin/python -c 'import vllm'), second" \
      "$(first .venv-engine/bin/python -c 'import vllm'); torch $(.venv-engine/bin/python -c 'import torch; print(torch.__version__)');" \
      "torchvision $(.venv-engine/bin/python -c 'import importlib.util as u; print("absent" if u.find_spec("torchvision") is None else "PRESENT")')"
  fi
  if [ -x .venv-agl1/bin/python ]; then
    echo "  check .venv-agl1: agentlightning $(.venv-agl1/bin/python -c 'import agentlightning; print(agentlightning.__version__)')," \
      "$(.venv-agl1/bin/python -m pip list --format=freeze 2>/dev/null | grep -c .) packages," \
      "mcp $(.venv-agl1/bin/python -c 'import importlib.metadata as m; print(m.version("mcp"))')"
  fi
fi
echo "TOTAL $total s (installer $installer, jobs $jobs: $targets); load after $(load)"
