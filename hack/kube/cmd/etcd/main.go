// Command etcd is etcd's own server entry point, built inside this module so
// that it uses the etcd version Kubernetes' dependency graph selects (etcd's
// server module cannot be `go install`ed: its go.mod has replace directives).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
