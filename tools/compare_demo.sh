#!/usr/bin/env bash
# Run `refinery demo` on two versions of this repository at the same checkout path (the `file`
# column of document tables holds absolute paths), then compare what they wrote (compare_roots.py).
#
#   tools/compare_demo.sh OLD_COMMIT [NEW_DIR]     # NEW_DIR defaults to this checkout's work tree
#
# Uses this checkout's .venv (or $PYTHON); the two data roots stay in /tmp/refinery-compare/{old,new}
# (or $COMPARE_DIR/{old,new}, so that two comparisons on one machine keep apart).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
old=$1; new=${2:-$repo}; work=${COMPARE_DIR:-/tmp/refinery-compare}; run_at=$work/checkout; py=${PYTHON:-$repo/.venv/bin/python}
mkdir -p "$work"
demo() {  # demo SOURCE_DIR OUT_DIR LOG: the demo with SOURCE_DIR's code laid at $run_at
  rm -rf "$run_at"; mkdir -p "$run_at"
  (cd "$1" && tar --exclude=./.venv --exclude=./.git --exclude=./out --exclude=./.dagster_home -cf - .) | tar -xf - -C "$run_at"
  mkdir -p "$run_at/.dagster_home"
  local cli=orchestration.cli; [[ -f $run_at/orchestration/cli.py ]] || cli=refinery.cli  # before the CLI moved
  (cd "$run_at" && PYTHONPATH=$run_at DAGSTER_HOME=$run_at/.dagster_home $py -m $cli demo --config configs/demo.yaml) >"$3" 2>&1
  rm -rf "$2"; mv "$run_at/out/demo" "$2"
}
rm -rf "$work/old-src"; mkdir -p "$work/old-src"; git -C "$repo" archive "$old" | tar -x -C "$work/old-src"
demo "$work/old-src" "$work/old" "$work/old.log"
demo "$new" "$work/new" "$work/new.log"
diff <(sed -n '/== Training/,$p' "$work/old.log") <(sed -n '/== Training/,$p' "$work/new.log") && echo "training summaries: same"
$py "$repo/tools/compare_roots.py" "$work/old" "$work/new"
