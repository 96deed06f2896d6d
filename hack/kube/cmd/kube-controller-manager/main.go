// Command kube-controller-manager is the upstream controller-manager entry
// point, rebuilt from the k8s.io/kubernetes Go module. The local control plane
// needs it for garbage collection, namespace deletion and ServiceAccounts.
package main

import (
	"os"
	_ "time/tzdata" // time zone data for the CronJob controller

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() {
	os.Exit(cli.Run(app.NewControllerManagerCommand()))
}
