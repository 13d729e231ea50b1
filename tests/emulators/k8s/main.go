// k8s-harness: a Kubernetes control plane built from the real components'
// source (etcd, kube-apiserver, kube-scheduler, kube-controller-manager,
// kubectl) plus node agents of its own that run pods as local processes.
// One binary, several programs, chosen by the first argument:
//
//	k8s-harness serve [flags]              the whole cluster (README.md)
//	k8s-harness selftest [flags]           starts one and checks it
//	k8s-harness kubectl ...                kubectl itself
//	k8s-harness kube-apiserver ...         the components, as serve starts them
//	k8s-harness kube-scheduler ...
//	k8s-harness kube-controller-manager ...
//
// A link or copy named kubectl (or any of the component names) runs that
// program too.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

const usage = `usage: k8s-harness serve|selftest|kubectl|kube-apiserver|kube-scheduler|kube-controller-manager [args]
       k8s-harness serve --help     the cluster's flags`

func main() {
	prog := filepath.Base(os.Args[0])
	args := os.Args[1:]
	if prog == "k8s-harness" || !isProgram(prog) {
		if len(args) == 0 {
			fmt.Fprintln(os.Stderr, usage)
			os.Exit(2)
		}
		prog = args[0]
		args = args[1:]
	}
	// The components parse os.Args[1:] themselves.
	os.Args = append([]string{prog}, args...)
	switch prog {
	case "serve":
		os.Exit(serveMain(args))
	case "selftest":
		os.Exit(selftestMain(args))
	case "kubectl":
		logs.GlogSetter(kubectlcmd.GetLogVerbosity(os.Args)) //nolint:errcheck
		if err := cli.RunNoErrOutput(kubectlcmd.NewDefaultKubectlCommand()); err != nil {
			kubectlutil.CheckErr(err)
		}
	case "kube-apiserver":
		os.Exit(cli.Run(apiserver.NewAPIServerCommand()))
	case "kube-scheduler":
		os.Exit(cli.Run(scheduler.NewSchedulerCommand()))
	case "kube-controller-manager":
		os.Exit(cli.Run(controllermanager.NewControllerManagerCommand()))
	case "-h", "--help", "help":
		fmt.Println(usage)
	default:
		fmt.Fprintf(os.Stderr, "k8s-harness: no program %q\n%s\n", prog, usage)
		os.Exit(2)
	}
}

func isProgram(name string) bool {
	switch name {
	case "serve", "selftest", "kubectl", "kube-apiserver", "kube-scheduler", "kube-controller-manager":
		return true
	}
	return false
}
