# Sourced by the scripts that build one Go command from the Go module proxy into the
# gpufleet cache (build-helm.sh, build-promtool.sh, build-registry.sh).
#
# go_tool_install NAME VERSION PACKAGE@VERSION OUT_DIR [go install flags...]
#   Builds PACKAGE (a main package whose binary is NAME) beside OUT_DIR/NAME and moves it
#   there when done, so a binary in use is never half-written; the log is OUT_DIR/build.log,
#   whose last lines are printed when the build fails. Prints the build's time.
go_tool_install() {
  local name="$1" version="$2" target="$3" out="$4" go_bin tmp start
  shift 4
  go_bin="$("$(dirname "${BASH_SOURCE[0]}")/find-go.sh")"
  mkdir -p "$out"
  echo "  $name $version: building ${target%@*} (log: $out/build.log)"
  start=$(date +%s)
  tmp="$(mktemp -d "$out/.build.XXXXXX")"
  if ! GOBIN="$tmp" CGO_ENABLED=0 GOFLAGS=-buildvcs=false GOTOOLCHAIN="${GOTOOLCHAIN:-auto}" \
      "$go_bin" install -trimpath "$@" "$target" > "$out/build.log" 2>&1; then
    rm -rf "$tmp"
    echo "build-$name: FAILED; last lines of $out/build.log:" >&2
    tail -20 "$out/build.log" >&2
    return 1
  fi
  mv -f "$tmp/$name" "$out/$name"
  rm -rf "$tmp"
  echo "  $name $version: built in $(( $(date +%s) - start )) s"
}
