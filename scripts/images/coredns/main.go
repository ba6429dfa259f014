// CoreDNS for the local cluster's machines (gpufleet.local.dns): CoreDNS's own
// coremain with only the plugins a cluster's DNS needs, so the build pulls no
// cloud provider SDKs. Built by gpufleet.local.images into gpufleet.local/coredns.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/ready"
)

func init() {
	// The order the plugins run in, as in CoreDNS's plugin.cfg.
	dnsserver.Directives = []string{"errors", "health", "ready", "kubernetes", "cache", "loadbalance"}
}

func main() { coremain.Run() }
