// Command kubectl is the upstream kubectl entry point from the k8s.io/kubectl
// module, built at the same version as the local control plane. It mirrors
// upstream's main, including the client auth plugins import.
package main

import (
	"os"

	_ "k8s.io/client-go/plugin/pkg/client/auth" // exec/OIDC client auth plugins
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
)

func main() {
	// Verbosity must be known before flag parsing: command construction
	// (plugins, .kuberc) already logs through klog.
	logs.GlogSetter(cmd.GetLogVerbosity(os.Args)) //nolint:errcheck
	if err := cli.RunNoErrOutput(cmd.NewDefaultKubectlCommand()); err != nil {
		util.CheckErr(err)
	}
}
