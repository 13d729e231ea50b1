package main

// selftest: starts `k8s-harness serve` (this binary) with three nodes, as a
// test would, and checks what tests rely on; exits 0 when every check
// passed. Each check prints one line, `ok <what>` or `FAIL <what>: why`.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/utils/ptr"
)

type selftest struct {
	ctx        context.Context
	client     kubernetes.Interface
	config     *rest.Config
	self       string
	kubeconfig string
	control    string
	failed     int
}

func (t *selftest) check(what string, err error) bool {
	if err != nil {
		t.failed++
		fmt.Printf("FAIL %s: %v\n", what, err)
		return false
	}
	fmt.Printf("ok   %s\n", what)
	return true
}

func selftestMain(args []string) int {
	fs := flag.NewFlagSet("selftest", flag.ExitOnError)
	keep := fs.Bool("keep", false, "keep the state directory")
	kueue := fs.String("kueue", "", "Kueue's binary (build-kueue.sh): serve starts it, and the Kueue checks run too")
	kueueOnly := fs.Bool("kueue-only", false, "with --kueue: only the Kueue checks (and the clean stop)")
	_ = fs.Parse(args)
	self, err := os.Executable()
	if err != nil {
		fmt.Println("FAIL", err)
		return 1
	}
	dir, err := os.MkdirTemp("", "k8s-harness-selftest-")
	if err != nil {
		fmt.Println("FAIL", err)
		return 1
	}
	if !*keep {
		defer os.RemoveAll(dir)
	}
	nodes := []NodeSpec{
		{Name: "cpu-a", Labels: map[string]string{"topology.kubernetes.io/zone": "zone-a", "karpenter.sh/capacity-type": "on-demand"},
			Capacity: map[string]string{"cpu": "8", "memory": "32Gi"}},
		{Name: "cpu-b", Labels: map[string]string{"topology.kubernetes.io/zone": "zone-b", "karpenter.sh/capacity-type": "spot"},
			Capacity: map[string]string{"cpu": "8", "memory": "32Gi"}},
		{Name: "gpu-a", Labels: map[string]string{"topology.kubernetes.io/zone": "zone-a", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
			"cloud.google.com/gce-topology-block": "b1", "cloud.google.com/gce-topology-subblock": "sb1", "cloud.google.com/gce-topology-host": "h1"},
			Capacity: map[string]string{"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": "8"}},
	}
	data, _ := json.Marshal(nodes)
	nodesFile := filepath.Join(dir, "nodes.json")
	_ = os.WriteFile(nodesFile, data, 0o644)
	state := filepath.Join(dir, "state")
	t0 := time.Now()
	serveArgs := []string{"serve", "--dir", state, "--nodes", nodesFile, "--node-monitor-grace-period", "6s"}
	if *kueue != "" {
		serveArgs = append(serveArgs, "--kueue", *kueue)
	}
	serve := exec.Command(self, serveArgs...)
	serve.Stderr = os.Stderr
	serve.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdout, _ := serve.StdoutPipe()
	if err := serve.Start(); err != nil {
		fmt.Println("FAIL start serve:", err)
		return 1
	}
	killServe := func() { _ = syscall.Kill(-serve.Process.Pid, syscall.SIGKILL) }
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "READY ") {
				ready <- sc.Text()
			}
		}
		close(ready)
	}()
	var line string
	select {
	case line = <-ready:
	case <-time.After(180 * time.Second):
	}
	if line == "" {
		fmt.Printf("FAIL serve did not say READY (logs in %s/logs)\n", state)
		killServe()
		return 1
	}
	fmt.Printf("ok   serve READY in %.1fs: %s\n", time.Since(t0).Seconds(), line)
	fields := map[string]string{}
	for _, f := range strings.Fields(line)[1:] {
		k, v, _ := strings.Cut(f, "=")
		fields[k] = v
	}
	t := &selftest{ctx: context.Background(), self: self, kubeconfig: fields["kubeconfig"], control: fields["control"]}
	if t.config, err = clientcmd.BuildConfigFromFlags("", t.kubeconfig); err == nil {
		t.client, err = kubernetes.NewForConfig(t.config)
	}
	if !t.check("client from the kubeconfig", err) {
		killServe()
		return 1
	}
	if *kueue == "" || !*kueueOnly {
		t.run(nodes)
	}
	if *kueue != "" {
		t.runKueue()
	}

	// SIGTERM: everything goes.
	_ = serve.Process.Signal(syscall.SIGTERM)
	waited := make(chan error, 1)
	go func() { waited <- serve.Wait() }()
	select {
	case err = <-waited:
		t.check("serve exits on SIGTERM", err)
	case <-time.After(30 * time.Second):
		t.check("serve exits on SIGTERM", fmt.Errorf("still running after 30 s"))
		killServe()
	}
	time.Sleep(300 * time.Millisecond)
	t.check("no process left behind", leftovers(state))
	if t.failed > 0 {
		fmt.Printf("selftest: %d checks FAILED (state kept in %s)\n", t.failed, state)
		*keep = true
		return 1
	}
	fmt.Printf("selftest: every check passed (%.1fs)\n", time.Since(t0).Seconds())
	return 0
}

// leftovers: a process whose command line or working directory names the
// state directory.
func leftovers(state string) error {
	entries, _ := os.ReadDir("/proc")
	var found []string
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		cwd, _ := os.Readlink(filepath.Join("/proc", e.Name(), "cwd"))
		if bytes.Contains(cmdline, []byte(state)) || strings.HasPrefix(cwd, state) {
			found = append(found, fmt.Sprintf("%d (%s)", pid, strings.ReplaceAll(string(cmdline), "\x00", " ")))
		}
	}
	if len(found) > 0 {
		return fmt.Errorf("still running: %s", strings.Join(found, "; "))
	}
	return nil
}

func pod(name, node string, restart corev1.RestartPolicy, script string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{
			RestartPolicy:                 restart,
			TerminationGracePeriodSeconds: ptr.To[int64](5),
			Containers: []corev1.Container{{Name: "main", Image: "none", Command: []string{"bash", "-c", script},
				Env: []corev1.EnvVar{{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}}}}},
		},
	}
	if node != "" {
		p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": node}
	}
	return p
}

func (t *selftest) waitPod(name string, limit time.Duration, ok func(*corev1.Pod) bool) (*corev1.Pod, error) {
	deadline := time.Now().Add(limit)
	var last *corev1.Pod
	for time.Now().Before(deadline) {
		p, err := t.client.CoreV1().Pods("default").Get(t.ctx, name, metav1.GetOptions{})
		if err == nil {
			last = p
			if ok(p) {
				return p, nil
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	if last == nil {
		return nil, fmt.Errorf("pod %s never seen", name)
	}
	b, _ := json.Marshal(last.Status)
	return last, fmt.Errorf("pod %s not as wanted within %v; status %s", name, limit, b)
}

func podRunning(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return p.Status.Phase == corev1.PodRunning
		}
	}
	return false
}

func (t *selftest) kubectl(stdin string, args ...string) (string, error) {
	cmd := exec.Command(t.self, append([]string{"kubectl", "--kubeconfig", t.kubeconfig}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, errb.String())
	}
	return out.String(), nil
}

func (t *selftest) run(nodes []NodeSpec) {
	core := t.client.CoreV1()
	// Nodes as given.
	list, err := core.Nodes().List(t.ctx, metav1.ListOptions{})
	if err == nil {
		for _, spec := range nodes {
			found := false
			for _, n := range list.Items {
				if n.Name != spec.Name {
					continue
				}
				found = true
				if !nodeReady(&n) {
					err = fmt.Errorf("node %s not Ready", n.Name)
				}
				for k, v := range spec.Labels {
					if n.Labels[k] != v {
						err = fmt.Errorf("node %s label %s=%q, want %q", n.Name, k, n.Labels[k], v)
					}
				}
				for k, v := range spec.Capacity {
					q := n.Status.Allocatable[corev1.ResourceName(k)]
					if q.Cmp(resource.MustParse(v)) != 0 {
						err = fmt.Errorf("node %s allocatable %s=%s, want %s", n.Name, k, q.String(), v)
					}
				}
			}
			if !found {
				err = fmt.Errorf("no node %s", spec.Name)
			}
		}
	}
	t.check("3 nodes Ready with their labels and capacity", err)

	// Every pod at once; the checks then wait for each.
	gpu := pod("gpu-job", "", corev1.RestartPolicyNever, `echo "hello from $HOSTNAME at $POD_IP"; sleep 3600`)
	gpu.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}
	server := pod("server", "cpu-a", corev1.RestartPolicyNever,
		`exec python3 -c 'import os,socket
s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((os.environ["POD_IP"], 7000)); s.listen(1)
print("listening", flush=True)
c,_=s.accept(); c.sendall(b"pong from "+os.environ["POD_IP"].encode()); c.close()'`)
	exit3 := pod("exit3", "", corev1.RestartPolicyNever, `echo bye; exit 3`)
	retry := pod("retry", "", corev1.RestartPolicyOnFailure, `n=$(cat count 2>/dev/null || echo 0); echo $((n+1)) > count; [ $n -ge 1 ]`)
	huge := pod("huge", "", corev1.RestartPolicyNever, `sleep 1`)
	huge.Spec.Containers[0].Resources.Requests = corev1.ResourceList{"cpu": resource.MustParse("1000")}
	victim := pod("victim", "cpu-b", corev1.RestartPolicyNever, `sleep 3600`)
	owner := pod("owner", "cpu-a", corev1.RestartPolicyNever, `sleep 3600`)
	owner.Spec.TerminationGracePeriodSeconds = ptr.To[int64](30)
	owner.Spec.Containers[0].Command = []string{"bash", "-c", `trap 'echo got TERM; exit 0' TERM; while :; do sleep 0.1; done`}
	for _, p := range []*corev1.Pod{gpu, server, exit3, retry, huge, victim, owner} {
		if _, err := core.Pods("default").Create(t.ctx, p, metav1.CreateOptions{}); err != nil {
			t.check("create pod "+p.Name, err)
		}
	}

	// Node deletion first: podgc takes its time (40 s of quarantine).
	p, err := t.waitPod("victim", 60*time.Second, podRunning)
	var victimPID int
	if t.check("victim runs on cpu-b", err) {
		victimPID, _ = strconv.Atoi(strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "harness://"))
		err = core.Nodes().Delete(t.ctx, "cpu-b", metav1.DeleteOptions{})
		if err == nil {
			deadline := time.Now().Add(10 * time.Second)
			for syscall.Kill(victimPID, 0) == nil && time.Now().Before(deadline) {
				time.Sleep(100 * time.Millisecond)
			}
			if syscall.Kill(victimPID, 0) == nil {
				err = fmt.Errorf("pid %d still alive 10 s after the node was deleted", victimPID)
			}
		}
		t.check(fmt.Sprintf("deleting node cpu-b killed the victim's process (pid %d)", victimPID), err)
	}

	p, err = t.waitPod("gpu-job", 60*time.Second, podRunning)
	if err == nil && p.Spec.NodeName != "gpu-a" {
		err = fmt.Errorf("on %s", p.Spec.NodeName)
	}
	t.check("a pod asking for nvidia.com/gpu runs on the GPU node", err)
	if err == nil {
		var out []byte
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			out, err = core.Pods("default").GetLogs("gpu-job", &corev1.PodLogOptions{}).DoRaw(t.ctx)
			if err == nil && bytes.Contains(out, []byte("hello from gpu-job at "+p.Status.PodIP)) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if err == nil && !bytes.Contains(out, []byte("hello from gpu-job at "+p.Status.PodIP)) {
			err = fmt.Errorf("logs %q", out)
		}
		t.check("its logs come back through the API", err)
		// Follow: a stream that ends when the client stops.
		ctx, cancel := context.WithTimeout(t.ctx, 3*time.Second)
		rc, ferr := core.Pods("default").GetLogs("gpu-job", &corev1.PodLogOptions{Follow: true}).Stream(ctx)
		if ferr == nil {
			buf := make([]byte, 100)
			n, _ := io.ReadAtLeast(rc, buf, 5)
			if !bytes.HasPrefix(buf[:n], []byte("hello")) {
				ferr = fmt.Errorf("followed %q", buf[:n])
			}
			rc.Close()
		}
		cancel()
		t.check("logs follow", ferr)

		// exec with stdin, through client-go (SPDY) and through kubectl.
		secret := "s3cr3t-" + strconv.Itoa(int(time.Now().UnixNano()))
		out2, err := t.exec("gpu-job", []string{"bash", "-c", `cat > secret.txt; echo "$HOSTNAME:$HARNESS_POD_IP:$(cat secret.txt)"`}, secret, false)
		want := "gpu-job:" + p.Status.PodIP + ":" + secret
		if err == nil && strings.TrimSpace(out2) != want {
			err = fmt.Errorf("got %q, want %q", out2, want)
		}
		t.check("exec (SPDY) with stdin round-trips, in the pod's env and directory", err)
		out2, err = t.exec("gpu-job", []string{"bash", "-c", `cat`}, secret, true)
		if err == nil && out2 != secret {
			err = fmt.Errorf("got %q", out2)
		}
		t.check("exec (websocket) with stdin round-trips", err)
		out3, err := t.kubectl(secret, "exec", "-i", "gpu-job", "--", "bash", "-c", "cat; echo; exit 7")
		if err == nil {
			err = fmt.Errorf("kubectl exec did not fail")
		} else if strings.Contains(err.Error(), "exit status 7") && strings.TrimSpace(out3) == secret {
			err = nil
		}
		t.check("kubectl exec -i: stdin round-trips and the exit code (7) comes back", err)
	}

	p, err = t.waitPod("server", 60*time.Second, podRunning)
	if err == nil {
		serverIP := p.Status.PodIP
		// Listening yet?
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			out, _ := core.Pods("default").GetLogs("server", &corev1.PodLogOptions{}).DoRaw(t.ctx)
			if bytes.Contains(out, []byte("listening")) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		client := pod("client", "gpu-a", corev1.RestartPolicyNever,
			`exec python3 -c 'import socket; c=socket.create_connection(("`+serverIP+`", 7000)); print(c.recv(100).decode())'`)
		if _, err = core.Pods("default").Create(t.ctx, client, metav1.CreateOptions{}); err == nil {
			var cp *corev1.Pod
			cp, err = t.waitPod("client", 60*time.Second, func(p *corev1.Pod) bool {
				return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
			})
			if err == nil {
				out, _ := core.Pods("default").GetLogs("client", &corev1.PodLogOptions{}).DoRaw(t.ctx)
				switch {
				case cp.Status.Phase != corev1.PodSucceeded:
					err = fmt.Errorf("client %s: %q", cp.Status.Phase, out)
				case cp.Status.PodIP == serverIP:
					err = fmt.Errorf("both pods have IP %s", serverIP)
				case !bytes.Contains(out, []byte("pong from "+serverIP)):
					err = fmt.Errorf("client said %q", out)
				}
				if err == nil {
					err = nil
					fmt.Printf("     server %s, client %s\n", serverIP, cp.Status.PodIP)
				}
			}
		}
	}
	t.check("two pods on two nodes talk TCP over their own pod IPs", err)

	p, err = t.waitPod("exit3", 60*time.Second, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
	if err == nil {
		term := p.Status.ContainerStatuses[0].State.Terminated
		if term == nil || term.ExitCode != 3 {
			err = fmt.Errorf("container state %+v", p.Status.ContainerStatuses[0].State)
		}
	}
	t.check("a pod that exits 3 is Failed with exit code 3", err)

	p, err = t.waitPod("retry", 60*time.Second, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodSucceeded })
	if err == nil && p.Status.ContainerStatuses[0].RestartCount != 1 {
		err = fmt.Errorf("restartCount %d", p.Status.ContainerStatuses[0].RestartCount)
	}
	t.check("restartPolicy OnFailure: restarted once, then Succeeded", err)

	err = fmt.Errorf("no FailedScheduling event")
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		evs, lerr := core.Events("default").List(t.ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("involvedObject.name", "huge").String()})
		if lerr == nil {
			for _, e := range evs.Items {
				if e.Reason == "FailedScheduling" {
					err = nil
					fmt.Printf("     %s\n", e.Message)
				}
			}
		}
		if err == nil {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.check("a pod that cannot fit gets a FailedScheduling event", err)

	// Garbage collection of a Secret owned by a pod, and graceful deletion.
	p, err = t.waitPod("owner", 60*time.Second, podRunning)
	if err == nil {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "owned", Namespace: "default",
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "owner", UID: p.UID}}},
			StringData: map[string]string{"k": "v"}}
		if _, err = core.Secrets("default").Create(t.ctx, s, metav1.CreateOptions{}); err == nil {
			ownerPID, _ := strconv.Atoi(strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "harness://"))
			ownerDir := t.podDir(p)
			start := time.Now()
			err = core.Pods("default").Delete(t.ctx, "owner", metav1.DeleteOptions{})
			if err == nil {
				err = fmt.Errorf("pod owner still there after 20 s")
				deadline := time.Now().Add(20 * time.Second)
				for time.Now().Before(deadline) {
					if _, gerr := core.Pods("default").Get(t.ctx, "owner", metav1.GetOptions{}); apierrors.IsNotFound(gerr) {
						err = nil
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
			if err == nil && syscall.Kill(ownerPID, 0) == nil {
				err = fmt.Errorf("pid %d alive after the pod went", ownerPID)
			}
			if err == nil {
				logs, _ := os.ReadFile(filepath.Join(ownerDir, "logs", "main-0.log"))
				if !bytes.Contains(logs, []byte("got TERM")) {
					err = fmt.Errorf("the process did not get SIGTERM first (log %q)", logs)
				}
			}
			t.check(fmt.Sprintf("graceful delete: SIGTERM, then the pod object goes (%.1fs)", time.Since(start).Seconds()), err)
			deadline := time.Now().Add(60 * time.Second)
			err = fmt.Errorf("secret still there after 60 s")
			for time.Now().Before(deadline) {
				if _, gerr := core.Secrets("default").Get(t.ctx, "owned", metav1.GetOptions{}); apierrors.IsNotFound(gerr) {
					err = nil
					break
				}
				time.Sleep(250 * time.Millisecond)
			}
		}
	}
	t.check("a Secret owned by a pod is garbage-collected after the pod", err)

	if victimPID != 0 {
		start := time.Now()
		deadline := time.Now().Add(120 * time.Second)
		err = fmt.Errorf("pod victim still there after 120 s")
		for time.Now().Before(deadline) {
			if _, gerr := core.Pods("default").Get(t.ctx, "victim", metav1.GetOptions{}); apierrors.IsNotFound(gerr) {
				err = nil
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
		t.check(fmt.Sprintf("podgc removed the deleted node's pod (after %.0fs more)", time.Since(start).Seconds()), err)
	}
}

// podDir asks the control endpoint where a pod runs.
func (t *selftest) podDir(p *corev1.Pod) string {
	resp, err := http.Get(t.control + "/pods/" + p.Namespace + "/" + p.Name)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var d struct {
		Dir string `json:"dir"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&d)
	return d.Dir
}

func (t *selftest) exec(podName string, argv []string, stdin string, websocket bool) (string, error) {
	req := t.client.CoreV1().RESTClient().Post().Resource("pods").Namespace("default").Name(podName).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: "main", Command: argv, Stdin: true, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	var ex remotecommand.Executor
	var err error
	if websocket {
		ex, err = remotecommand.NewWebSocketExecutor(t.config, "GET", req.URL().String())
	} else {
		ex, err = remotecommand.NewSPDYExecutor(t.config, "POST", req.URL())
	}
	if err != nil {
		return "", err
	}
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(t.ctx, 20*time.Second)
	defer cancel()
	err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: strings.NewReader(stdin), Stdout: &out, Stderr: &errb})
	if err != nil {
		return out.String(), fmt.Errorf("%v (stderr %q)", err, errb.String())
	}
	return out.String(), nil
}
