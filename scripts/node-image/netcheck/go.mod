// The node image's network check: a container image built here (no registry is
// reachable from a node) that serves HTTP or fetches URLs, so that pod
// networking and Services on a node can be checked with a pod of its own.
module gpufleet.local/node-image/netcheck

go 1.26.0
