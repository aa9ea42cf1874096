// etcd, as go.etcd.io/etcd/v3's main.go builds it, from the server module Kubernetes tests with.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
