// CoreDNS as its coredns.go builds it, with the plugins of kubeadm's default Corefile
// (errors, health, ready, kubernetes, prometheus, forward, cache, loop, reload,
// loadbalance) and log compiled in instead of all of core/plugin: the same server, a
// fraction of the packages to compile. This is CoreDNS' documented way to choose plugins
// at build time: import them and set dnsserver.Directives, which orders them in a server
// block. The order below is upstream's plugin.cfg order, filtered.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

var directives = []string{
	"reload",
	"ready",
	"health",
	"prometheus",
	"errors",
	"log",
	"loadbalance",
	"cache",
	"kubernetes",
	"loop",
	"forward",
}

func init() {
	dnsserver.Directives = directives
}

func main() {
	coremain.Run()
}
