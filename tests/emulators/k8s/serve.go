package main

// serve: etcd in this process; kube-apiserver, kube-scheduler and
// kube-controller-manager as child processes of this same binary (each the
// real command with its real flags, so that their global state, flags and
// signal handling stay as upstream has them); the node agents in this
// process; a small control endpoint for tests.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"
)

// NodeSpec is one node as tests give it (JSON or YAML).
type NodeSpec struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels,omitempty"`
	// Capacity: cpu, memory, pods, nvidia.com/gpu, ... as quantities
	// ("8", "64Gi"). cpu 4, memory 16Gi and pods 110 unless given.
	Capacity map[string]string `json:"capacity,omitempty"`
	// Allocatable: the capacity unless given.
	Allocatable map[string]string `json:"allocatable,omitempty"`
	Taints      []corev1.Taint    `json:"taints,omitempty"`
}

type harness struct {
	dir        string
	octet      int // pods and nodes live in 127.<octet>.<node>.<n>
	pki        *pki
	kubeconfig string
	apiPort    int
	restConfig *rest.Config
	client     kubernetes.Interface
	ctx        context.Context
	stop       context.CancelFunc

	mu        sync.Mutex
	nodes     map[string]*nodeAgent
	nextIndex int
	children  []*child
	pgidFile  string
	etcd      *embed.Etcd
}

// child is a component process of this harness.
type child struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

func serveMain(args []string) int {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	dir := fs.String("dir", "", "state directory (certificates, etcd, logs, pods' working directories); a new temporary one when empty")
	kubeconfig := fs.String("kubeconfig", "", "where to write the admin kubeconfig (default DIR/kubeconfig)")
	nodesFile := fs.String("nodes", "", "JSON or YAML file: a list of node specs ({name, labels, capacity, allocatable, taints})")
	nodeGrace := fs.Duration("node-monitor-grace-period", 10*time.Second, "kube-controller-manager's: how long a node may miss heartbeats before it is NotReady (Unknown)")
	toleration := fs.Int("default-unreachable-toleration-seconds", 300, "kube-apiserver's: how long pods stay bound to a NotReady or unreachable node before eviction (also the not-ready toleration)")
	verbosity := fs.Int("v", 1, "log level of the components (their logs are in DIR/logs)")
	kueue := fs.String("kueue", "", "Kueue's binary as build-kueue.sh left it (its manifests in kueue-config/ beside it): start Kueue too (logs/kueue.log)")
	_ = fs.Parse(args)
	klog.InitFlags(nil)
	_ = flag.Set("v", "0")

	var specs []NodeSpec
	if *nodesFile != "" {
		data, err := os.ReadFile(*nodesFile)
		if err != nil {
			fmt.Fprintf(os.Stderr, "k8s-harness serve: %v\n", err)
			return 2
		}
		if err := yaml.Unmarshal(data, &specs); err != nil {
			fmt.Fprintf(os.Stderr, "k8s-harness serve: %s: %v\n", *nodesFile, err)
			return 2
		}
	}
	h, err := startHarness(harnessOptions{
		dir: *dir, kubeconfig: *kubeconfig, nodes: specs,
		nodeGrace: *nodeGrace, toleration: *toleration, verbosity: *verbosity,
		kueue: *kueue,
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "k8s-harness serve: %v\n", err)
		if h != nil {
			h.shutdown()
		}
		return 1
	}
	ctl, err := h.serveControl()
	if err != nil {
		fmt.Fprintf(os.Stderr, "k8s-harness serve: control endpoint: %v\n", err)
		h.shutdown()
		return 1
	}
	fmt.Printf("READY kubeconfig=%s control=%s dir=%s\n", h.kubeconfig, ctl, h.dir)
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	select {
	case s := <-sigs:
		fmt.Fprintf(os.Stderr, "k8s-harness serve: %v, stopping\n", s)
	case <-h.ctx.Done():
		fmt.Fprintln(os.Stderr, "k8s-harness serve: a component exited, stopping")
	}
	h.shutdown()
	return 0
}

type harnessOptions struct {
	dir, kubeconfig string
	nodes           []NodeSpec
	nodeGrace       time.Duration
	toleration      int
	verbosity       int
	kueue           string       // Kueue's binary; none when empty
	out             func(string) // progress lines (stderr when nil)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// claimOctet reserves 127.X.0.0/16 for this harness: a lock held for the
// process's life on /tmp/k8s-harness-octets/X, so that two harnesses on one
// machine never hand out the same pod IPs.
// octetLock: the open file whose lock claimOctet holds.
var octetLock *os.File

func claimOctet() (int, error) {
	dir := filepath.Join(os.TempDir(), "k8s-harness-octets")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return 0, err
	}
	start := 100 + os.Getpid()%100
	for i := 0; i < 100; i++ {
		x := 100 + (start-100+i)%100
		f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(x)), os.O_CREATE|os.O_RDWR, 0o666)
		if err != nil {
			return 0, err
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err == nil {
			// Held until this process exits: f stays referenced, or the
			// garbage collector's finalizer would close it and drop the
			// lock while the addresses are in use (another harness then
			// took the same /16: "bind: address already in use").
			octetLock = f
			return x, nil
		}
		f.Close()
	}
	return 0, errors.New("every 127.X.0.0/16 of 100-199 is held by another harness")
}

func startHarness(o harnessOptions) (*harness, error) {
	say := o.out
	if say == nil {
		say = func(s string) { fmt.Fprintln(os.Stderr, "k8s-harness: "+s) }
	}
	if o.dir == "" {
		d, err := os.MkdirTemp("", "k8s-harness-")
		if err != nil {
			return nil, err
		}
		o.dir = d
	}
	dir, err := filepath.Abs(o.dir)
	if err != nil {
		return nil, err
	}
	for _, sub := range []string{"logs", "pods"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return nil, err
		}
	}
	ctx, stop := context.WithCancel(context.Background())
	h := &harness{dir: dir, ctx: ctx, stop: stop, nodes: map[string]*nodeAgent{}, pgidFile: filepath.Join(dir, "pgids")}
	if h.octet, err = claimOctet(); err != nil {
		return h, err
	}
	if h.pki, err = newPKI(filepath.Join(dir, "pki")); err != nil {
		return h, err
	}
	t0 := time.Now()

	// etcd, in this process.
	clientPort, err := freePort()
	if err != nil {
		return h, err
	}
	peerPort, err := freePort()
	if err != nil {
		return h, err
	}
	cfg := embed.NewConfig()
	cfg.Name = "harness"
	cfg.Dir = filepath.Join(dir, "etcd")
	cu, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", clientPort))
	pu, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", peerPort))
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "warn"
	cfg.LogOutputs = []string{filepath.Join(dir, "logs", "etcd.log")}
	cfg.UnsafeNoFsync = true
	etcd, err := embed.StartEtcd(cfg)
	if err != nil {
		return h, fmt.Errorf("etcd: %w", err)
	}
	select {
	case <-etcd.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		return h, errors.New("etcd did not become ready within 60 s")
	}
	h.etcd = etcd
	say(fmt.Sprintf("etcd ready on %s (%.1fs)", cu, time.Since(t0).Seconds()))

	// Certificates and the admin kubeconfig.
	if h.apiPort, err = freePort(); err != nil {
		return h, err
	}
	p := h.pki
	apiCrt, apiKey, err := p.issue("apiserver", "kube-apiserver", nil,
		[]net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.96.0.1")},
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}, true)
	if err != nil {
		return h, err
	}
	kcCrt, kcKey, err := p.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}, nil, nil, false)
	if err != nil {
		return h, err
	}
	adminCrt, adminKey, err := p.issue("admin", "kubernetes-admin", []string{"system:masters"}, nil, nil, false)
	if err != nil {
		return h, err
	}
	h.kubeconfig = o.kubeconfig
	if h.kubeconfig == "" {
		h.kubeconfig = filepath.Join(dir, "kubeconfig")
	}
	if h.kubeconfig, err = filepath.Abs(h.kubeconfig); err != nil {
		return h, err
	}
	if err := writeKubeconfig(h.kubeconfig, fmt.Sprintf("https://127.0.0.1:%d", h.apiPort), p.caPEM, adminCrt, adminKey); err != nil {
		return h, err
	}
	if h.restConfig, err = clientcmd.BuildConfigFromFlags("", h.kubeconfig); err != nil {
		return h, err
	}
	h.restConfig.QPS, h.restConfig.Burst = 200, 400
	if h.client, err = kubernetes.NewForConfig(h.restConfig); err != nil {
		return h, err
	}

	v := strconv.Itoa(o.verbosity)
	tol := strconv.Itoa(o.toleration)
	if err := h.startChild("kube-apiserver",
		"--etcd-servers="+cu.String(),
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(h.apiPort),
		"--tls-cert-file="+apiCrt, "--tls-private-key-file="+apiKey,
		"--client-ca-file="+p.path("ca.crt"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+p.path("sa.pub"),
		"--service-account-signing-key-file="+p.path("sa.key"),
		"--service-cluster-ip-range=10.96.0.0/16",
		"--authorization-mode=RBAC",
		"--allow-privileged=true",
		"--endpoint-reconciler-type=none",
		"--kubelet-certificate-authority="+p.path("ca.crt"),
		"--kubelet-client-certificate="+kcCrt, "--kubelet-client-key="+kcKey,
		"--kubelet-preferred-address-types=InternalIP",
		"--default-not-ready-toleration-seconds="+tol,
		"--default-unreachable-toleration-seconds="+tol,
		"--profiling=false",
		"--v="+v,
	); err != nil {
		return h, err
	}
	if err := h.waitAPI(90 * time.Second); err != nil {
		return h, err
	}
	say(fmt.Sprintf("kube-apiserver ready on https://127.0.0.1:%d (%.1fs)", h.apiPort, time.Since(t0).Seconds()))

	if err := h.startChild("kube-scheduler",
		"--kubeconfig="+h.kubeconfig,
		"--authentication-kubeconfig="+h.kubeconfig,
		"--authorization-kubeconfig="+h.kubeconfig,
		"--leader-elect=false", "--secure-port=0", "--v="+v,
	); err != nil {
		return h, err
	}
	if err := h.startChild("kube-controller-manager",
		"--kubeconfig="+h.kubeconfig,
		"--authentication-kubeconfig="+h.kubeconfig,
		"--authorization-kubeconfig="+h.kubeconfig,
		"--leader-elect=false", "--secure-port=0",
		"--controllers="+strings.Join([]string{
			"garbage-collector-controller", "pod-garbage-collector-controller",
			"node-lifecycle-controller", "taint-eviction-controller",
			"namespace-controller", "serviceaccount-controller", "serviceaccount-token-controller",
			"root-ca-certificate-publisher-controller", "clusterrole-aggregation-controller",
			"replicaset-controller", "deployment-controller", "statefulset-controller",
			"job-controller", "ttl-after-finished-controller", "disruption-controller",
			"resourcequota-controller",
		}, ","),
		"--service-account-private-key-file="+p.path("sa.key"),
		"--root-ca-file="+p.path("ca.crt"),
		"--use-service-account-credentials=false",
		"--node-monitor-period=1s",
		"--node-monitor-grace-period="+o.nodeGrace.String(),
		"--v="+v,
	); err != nil {
		return h, err
	}

	for _, spec := range o.nodes {
		if _, err := h.addNode(spec); err != nil {
			return h, err
		}
	}
	if err := h.waitReady(120 * time.Second); err != nil {
		return h, err
	}
	say(fmt.Sprintf("cluster ready: %d nodes (%.1fs)", len(o.nodes), time.Since(t0).Seconds()))
	if o.kueue != "" {
		if err := h.startKueue(o.kueue, say); err != nil {
			return h, err
		}
	}
	return h, nil
}

func writeKubeconfig(path, server string, ca []byte, crt, key string) error {
	crtPEM, err := os.ReadFile(crt)
	if err != nil {
		return err
	}
	keyPEM, err := os.ReadFile(key)
	if err != nil {
		return err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["harness"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: crtPEM, ClientKeyData: keyPEM}
	cfg.Contexts["harness"] = &clientcmdapi.Context{Cluster: "harness", AuthInfo: "admin", Namespace: "default"}
	cfg.CurrentContext = "harness"
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return clientcmd.WriteToFile(*cfg, path)
}

// spawner runs every fork from one goroutine locked to its thread, so that
// Pdeathsig (sent when the forking *thread* ends) means "when this process
// ends": Go never ends a thread that stays locked.
var spawnRequests = make(chan spawnRequest)

type spawnRequest struct {
	cmd  *exec.Cmd
	done chan error
}

func init() {
	go func() {
		runtime.LockOSThread()
		for r := range spawnRequests {
			r.done <- r.cmd.Start()
		}
	}()
}

// spawn starts cmd in a process group of its own that gets SIGKILL when
// this process dies.
func spawn(cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	done := make(chan error, 1)
	spawnRequests <- spawnRequest{cmd, done}
	return <-done
}

func (h *harness) startChild(name string, args ...string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	logf, err := os.OpenFile(filepath.Join(h.dir, "logs", name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(self, append([]string{name}, args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = os.Environ()
	return h.startProcess(name, cmd, logf)
}

// startProcess starts cmd as the component name (its log in logf): stopped
// with the others, and its exit before that stops the harness.
func (h *harness) startProcess(name string, cmd *exec.Cmd, logf *os.File) error {
	if err := spawn(cmd); err != nil {
		logf.Close()
		return fmt.Errorf("%s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, done: make(chan struct{})}
	h.mu.Lock()
	h.children = append(h.children, c)
	h.mu.Unlock()
	go func() {
		err := cmd.Wait()
		logf.Close()
		close(c.done)
		if h.ctx.Err() == nil {
			fmt.Fprintf(os.Stderr, "k8s-harness: %s exited (%v); its log: %s\n", name, err, filepath.Join(h.dir, "logs", name+".log"))
			h.stop()
		}
	}()
	return nil
}

func (h *harness) waitAPI(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	var last error
	for time.Now().Before(deadline) {
		if h.ctx.Err() != nil {
			return errors.New("kube-apiserver exited before it was ready; see " + filepath.Join(h.dir, "logs", "kube-apiserver.log"))
		}
		body, err := h.client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(h.ctx)
		if err == nil && string(body) == "ok" {
			return nil
		}
		last = err
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("kube-apiserver not ready within %v: %v (log: %s)", limit, last, filepath.Join(h.dir, "logs", "kube-apiserver.log"))
}

// waitReady: every node Ready and schedulable (the not-ready taint gone),
// and the default service account there.
func (h *harness) waitReady(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	why := ""
	for time.Now().Before(deadline) {
		if h.ctx.Err() != nil {
			return errors.New("a component exited before the cluster was ready (logs in " + filepath.Join(h.dir, "logs") + ")")
		}
		why = h.notReady()
		if why == "" {
			return nil
		}
		time.Sleep(250 * time.Millisecond)
	}
	return fmt.Errorf("cluster not ready within %v: %s (logs in %s)", limit, why, filepath.Join(h.dir, "logs"))
}

func (h *harness) notReady() string {
	if _, err := h.client.CoreV1().ServiceAccounts("default").Get(h.ctx, "default", metav1.GetOptions{}); err != nil {
		return "no default service account yet: " + err.Error()
	}
	h.mu.Lock()
	names := make([]string, 0, len(h.nodes))
	for n := range h.nodes {
		names = append(names, n)
	}
	h.mu.Unlock()
	for _, n := range names {
		node, err := h.client.CoreV1().Nodes().Get(h.ctx, n, metav1.GetOptions{})
		if err != nil {
			return "node " + n + ": " + err.Error()
		}
		if !nodeReady(node) {
			return "node " + n + " not Ready"
		}
		for _, t := range node.Spec.Taints {
			if t.Key == corev1.TaintNodeNotReady || t.Key == corev1.TaintNodeUnreachable {
				return "node " + n + " still has taint " + t.Key
			}
		}
	}
	return ""
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func (h *harness) addNode(spec NodeSpec) (*nodeAgent, error) {
	if spec.Name == "" {
		return nil, errors.New("a node spec without a name")
	}
	h.mu.Lock()
	if _, ok := h.nodes[spec.Name]; ok {
		h.mu.Unlock()
		return nil, fmt.Errorf("node %s exists", spec.Name)
	}
	h.nextIndex++
	index := h.nextIndex
	h.mu.Unlock()
	if index > 254 {
		return nil, errors.New("at most 254 nodes per harness")
	}
	a, err := newNodeAgent(h, spec, index)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", spec.Name, err)
	}
	h.mu.Lock()
	h.nodes[spec.Name] = a
	h.mu.Unlock()
	return a, nil
}

// removeNode: the machine is gone. Its Node object is deleted and its pods'
// processes are killed at once; the pods themselves are left to podgc.
func (h *harness) removeNode(name string) ([]int, error) {
	h.mu.Lock()
	a := h.nodes[name]
	h.mu.Unlock()
	if a == nil {
		return nil, fmt.Errorf("no node %s", name)
	}
	err := h.client.CoreV1().Nodes().Delete(h.ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, err
	}
	return a.vanish(), nil
}

func (h *harness) forgetNode(name string) {
	h.mu.Lock()
	delete(h.nodes, name)
	h.mu.Unlock()
}

// recordPgid appends a pod process group to DIR/pgids, for whoever must
// clean up after a harness that was SIGKILLed (tests/support's Drop).
func (h *harness) recordPgid(pgid int) {
	f, err := os.OpenFile(h.pgidFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return
	}
	fmt.Fprintf(f, "%d\n", pgid)
	f.Close()
}

func (h *harness) shutdown() {
	h.mu.Lock()
	agents := make([]*nodeAgent, 0, len(h.nodes))
	for _, a := range h.nodes {
		agents = append(agents, a)
	}
	children := append([]*child(nil), h.children...)
	h.mu.Unlock()
	var wg sync.WaitGroup
	for _, a := range agents {
		wg.Add(1)
		go func() { defer wg.Done(); a.vanish() }()
	}
	wg.Wait()
	h.stop()
	// Components: SIGTERM, then SIGKILL after 10 s; controllers first.
	for i := len(children) - 1; i >= 0; i-- {
		c := children[i]
		_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-c.done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
			<-c.done
		}
	}
	// etcd last: the apiserver drains against it.
	if h.etcd != nil {
		h.etcd.Close()
	}
}

// The control endpoint: http://127.0.0.1:PORT
//
//	GET    /nodes                    the agents: name, ip, frozen, pods
//	POST   /nodes                    add one (a NodeSpec as JSON); answers when it is registered
//	DELETE /nodes/NAME               the machine is gone: delete the Node, kill its pods' processes
//	POST   /nodes/NAME/freeze        stop heartbeats and pod handling (NotReady after the grace period)
//	POST   /nodes/NAME/thaw          resume them
//	GET    /pods/NS/NAME             where a pod runs: node, ip, dir, container PIDs
func (h *harness) serveControl() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	mux := http.NewServeMux()
	reply := func(w http.ResponseWriter, v any, err error) {
		w.Header().Set("Content-Type", "application/json")
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
			return
		}
		_ = json.NewEncoder(w).Encode(v)
	}
	mux.HandleFunc("GET /nodes", func(w http.ResponseWriter, r *http.Request) {
		h.mu.Lock()
		var out []any
		for _, a := range h.nodes {
			out = append(out, a.describe())
		}
		h.mu.Unlock()
		sort.Slice(out, func(i, j int) bool {
			return out[i].(map[string]any)["name"].(string) < out[j].(map[string]any)["name"].(string)
		})
		reply(w, out, nil)
	})
	mux.HandleFunc("POST /nodes", func(w http.ResponseWriter, r *http.Request) {
		var spec NodeSpec
		if err := json.NewDecoder(r.Body).Decode(&spec); err != nil {
			reply(w, nil, err)
			return
		}
		a, err := h.addNode(spec)
		if err != nil {
			reply(w, nil, err)
			return
		}
		reply(w, a.describe(), nil)
	})
	mux.HandleFunc("DELETE /nodes/{name}", func(w http.ResponseWriter, r *http.Request) {
		pids, err := h.removeNode(r.PathValue("name"))
		reply(w, map[string]any{"killed": pids}, err)
	})
	mux.HandleFunc("POST /nodes/{name}/{op}", func(w http.ResponseWriter, r *http.Request) {
		h.mu.Lock()
		a := h.nodes[r.PathValue("name")]
		h.mu.Unlock()
		if a == nil {
			reply(w, nil, fmt.Errorf("no node %s", r.PathValue("name")))
			return
		}
		switch r.PathValue("op") {
		case "freeze":
			a.setFrozen(true)
		case "thaw":
			a.setFrozen(false)
		default:
			reply(w, nil, fmt.Errorf("no operation %s (freeze, thaw)", r.PathValue("op")))
			return
		}
		reply(w, a.describe(), nil)
	})
	mux.HandleFunc("GET /pods/{ns}/{name}", func(w http.ResponseWriter, r *http.Request) {
		h.mu.Lock()
		agents := make([]*nodeAgent, 0, len(h.nodes))
		for _, a := range h.nodes {
			agents = append(agents, a)
		}
		h.mu.Unlock()
		for _, a := range agents {
			if pr := a.podByName(r.PathValue("ns"), r.PathValue("name")); pr != nil {
				reply(w, pr.describe(), nil)
				return
			}
		}
		reply(w, nil, fmt.Errorf("no pod %s/%s on any node", r.PathValue("ns"), r.PathValue("name")))
	})
	go func() { _ = http.Serve(l, mux) }()
	return "http://" + l.Addr().String(), nil
}
