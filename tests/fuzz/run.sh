#!/usr/bin/env bash
# Builds the libFuzzer target (preset "fuzz": clang, ASan) and fuzzes the checkpoint and trace readers
# for FUZZ_SECONDS (default 30) from a corpus of real files made by build/culprit, with a fixed seed.
# Every crash is re-run and classified by its innermost frame of real code (sanitizer interceptors
# such as ASan's strdup are skipped):
#   - inside culprit's code: a culprit bug -> exit 1;
#   - inside libhdf5 (HDF5 1.10's own parser on a damaged header): reported, listed in
#     $OUT/hdf5-defects.txt, not failing: culprit cannot fix the library it links.
#   - not reproduced when re-run alone (no stack frame: a timeout or out-of-memory in fork mode under
#     load, or a crash that depends on uninitialised memory): listed in $OUT/unreproduced.txt with the
#     head of its report, not failing, since there is no frame to blame; a longer run re-finds it.
# Longer run: FUZZ_SECONDS=3600 tests/fuzz/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/env.sh
seconds="${FUZZ_SECONDS:-30}"
out="${FUZZ_OUT:-build-fuzz/fuzz-out}"
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz >/dev/null
rm -rf "$out" && mkdir -p "$out/corpus" "$out/artifacts"
run_dir="$out/run"
build/culprit train --run-dir "$run_dir" --steps 3 --checkpoint-every 2 --micro-shards 2 --global-batch 8 \
  --samples 64 --hidden 8 --trace layer --quiet >/dev/null
cp "$run_dir"/checkpoints/*.h5 "$run_dir"/trace/*.h5 "$out/corpus/"
export ASAN_OPTIONS=detect_leaks=0
build-fuzz/tests/fuzz_readers -fork=1 -ignore_crashes=1 -seed=1 -max_total_time="$seconds" -rss_limit_mb=2048 \
  -artifact_prefix="$out/artifacts/" "$out/corpus" >"$out/fuzz.log" 2>&1 || true
grep -E "stat::number_of_executed_units|INFO: fuzzed for|crashes:" "$out/fuzz.log" | tail -n 3 || true
ours=0 hdf5=0 unrepro=0
: >"$out/hdf5-defects.txt"
: >"$out/unreproduced.txt"
for a in "$out"/artifacts/crash-* "$out"/artifacts/leak-* "$out"/artifacts/timeout-* "$out"/artifacts/oom-*; do
  [ -e "$a" ] || continue
  # One huge allocation is reported by the malloc limit alone (with its stack); the RSS limit is
  # higher so that its thread does not race that report and cut it short.
  report=$(build-fuzz/tests/fuzz_readers -timeout=60 -malloc_limit_mb=2048 -rss_limit_mb=4096 "$a" 2>&1 || true)
  # The innermost frame that is real code: sanitizer runtime and its libc interceptors (strdup,
  # memcpy, ...) live in the fuzz binary itself with no source location, so they are skipped.
  frame=$(printf '%s\n' "$report" | grep -E '^ +#[0-9]+ ' \
    | grep -v -E '\(\S*fuzz_readers\+0x[0-9a-f]+\)' \
    | grep -v -E '__interceptor|__asan|__sanitizer|fuzzer::|sysdeps|libc\.so' | head -n 1 || true)
  if [ -z "$frame" ]; then
    unrepro=$((unrepro + 1))
    { echo "$a:"; printf '%s\n' "$report" | tail -n 5; } >>"$out/unreproduced.txt"
  elif printf '%s' "$frame" | grep -q 'libhdf5'; then
    hdf5=$((hdf5 + 1))
    echo "$a: $frame" >>"$out/hdf5-defects.txt"
  else
    ours=$((ours + 1))
    echo "fuzz: culprit defect in $a:" >&2
    printf '%s\n' "$report" | grep -E 'ERROR|^ +#' | head -n 12 >&2 || true
  fi
done
echo "fuzz: ${seconds}s, $ours crash(es) in culprit, $hdf5 inside libhdf5 (listed in $out/hdf5-defects.txt)," \
  "$unrepro not reproduced alone (listed in $out/unreproduced.txt)"
[ "$unrepro" -eq 0 ] || cat "$out/unreproduced.txt"
[ "$ours" -eq 0 ]
