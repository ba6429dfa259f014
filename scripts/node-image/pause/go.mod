// The pod sandbox ("pause") process of the node image: no registry is
// reachable from a node, so the image containerd starts every pod with is
// built here from this source (scripts/node-image/build.sh).
module gpufleet.local/node-image/pause

go 1.26.0
