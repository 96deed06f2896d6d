// Command kubeadm is the upstream cluster bootstrapper, rebuilt from the
// k8s.io/kubernetes Go module for the offline kind node image (kind runs it in the node).
package main

import (
	"k8s.io/kubernetes/cmd/kubeadm/app"
	utilerrors "k8s.io/kubernetes/cmd/kubeadm/app/util/errors"
)

func main() {
	utilerrors.HandleError(app.Run())
}
