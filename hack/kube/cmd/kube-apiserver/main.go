// Command kube-apiserver is the upstream kube-apiserver entry point, rebuilt
// from the k8s.io/kubernetes Go module for a local control plane without
// containers. The blank imports mirror upstream's main package.
package main

import (
	"os"
	_ "time/tzdata" // time zone data for CronJob validation

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
