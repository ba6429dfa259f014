# Sourced by the release scripts (with $root set): $helm, the helm to use ($HELM, else
# the one scripts/build-helm.sh built into the gpufleet cache, else helm on PATH), and project_version.
helm="${HELM:-}"
if [[ -z "$helm" ]]; then
  for found in "${GPUFLEET_CACHE:-$HOME/.cache/gpufleet}"/bin/helm-*/helm; do
    [[ -x "$found" ]] && helm="$found"
  done
fi
helm="${helm:-$(command -v helm || true)}"
if [[ -z "$helm" ]]; then
  echo "no helm: set HELM=/path/to/helm, or run scripts/build-helm.sh" >&2
  exit 1
fi

# project_version: the one source of the version, gpufleet.__version__.
project_version() {
  sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$root/src/gpufleet/__init__.py" | head -1
}
