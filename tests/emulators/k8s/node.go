package main

// A node agent: what a kubelet does for the API, with pods run as local
// processes (pod.go). One per node, all in the harness's process: each has
// its own address (127.X.N.1), its own TLS server on port 10250 there (logs
// and exec), its own informers on its pods and its Node, and its own
// heartbeat loop. In-process because a node's state (its pods' processes,
// IPs, frozen or not) is what tests poke at through the control endpoint;
// a process per node would only add a protocol for that.

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

const kubeletPort = 10250

type nodeAgent struct {
	h     *harness
	spec  NodeSpec
	index int
	ip    string
	ctx   context.Context
	stop  context.CancelFunc

	frozen   atomic.Bool
	gone     atomic.Bool
	server   *http.Server
	podStore cache.Store

	mu     sync.Mutex
	pods   map[types.UID]*podRun
	nextIP int
	ipUsed map[string]bool
}

func quantities(m map[string]string, defaults map[string]string) (corev1.ResourceList, error) {
	out := corev1.ResourceList{}
	for k, v := range defaults {
		if _, ok := m[k]; !ok {
			out[corev1.ResourceName(k)] = resource.MustParse(v)
		}
	}
	for k, v := range m {
		q, err := resource.ParseQuantity(v)
		if err != nil {
			return nil, fmt.Errorf("%s=%q: %w", k, v, err)
		}
		out[corev1.ResourceName(k)] = q
	}
	return out, nil
}

func newNodeAgent(h *harness, spec NodeSpec, index int) (*nodeAgent, error) {
	ip := fmt.Sprintf("127.%d.%d.1", h.octet, index)
	ctx, stop := context.WithCancel(h.ctx)
	a := &nodeAgent{h: h, spec: spec, index: index, ip: ip, ctx: ctx, stop: stop,
		pods: map[types.UID]*podRun{}, ipUsed: map[string]bool{}, nextIP: 2}

	// The kubelet's server: logs and exec, TLS with a certificate of the
	// harness CA for the node's address (the apiserver checks it).
	crt, key, err := h.pki.issue("node-"+spec.Name, "system:node:"+spec.Name, []string{"system:nodes"},
		[]net.IP{net.ParseIP(ip)}, []string{spec.Name}, true)
	if err != nil {
		stop()
		return nil, err
	}
	pair, err := tls.LoadX509KeyPair(crt, key)
	if err != nil {
		stop()
		return nil, err
	}
	l, err := net.Listen("tcp", fmt.Sprintf("%s:%d", ip, kubeletPort))
	if err != nil {
		stop()
		return nil, fmt.Errorf("kubelet port: %w", err)
	}
	a.server = &http.Server{Handler: a.handler(), TLSConfig: &tls.Config{Certificates: []tls.Certificate{pair}}}
	go func() { _ = a.server.ServeTLS(l, "", "") }()

	if err := a.register(); err != nil {
		a.vanish()
		return nil, err
	}
	// Pods bound here, and this Node (its deletion means the machine is gone).
	podInformers := informers.NewSharedInformerFactoryWithOptions(h.client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", spec.Name).String()
		}))
	pi := podInformers.Core().V1().Pods().Informer()
	_, _ = pi.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { a.podEvent(o) },
		UpdateFunc: func(_, o any) { a.podEvent(o) },
		DeleteFunc: func(o any) { a.podEvent(o) },
	})
	a.podStore = pi.GetStore()
	nodeInformers := informers.NewSharedInformerFactoryWithOptions(h.client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", spec.Name).String()
		}))
	ni := nodeInformers.Core().V1().Nodes().Informer()
	_, _ = ni.AddEventHandler(cache.ResourceEventHandlerFuncs{
		DeleteFunc: func(any) {
			if !a.gone.Load() {
				fmt.Fprintf(os.Stderr, "k8s-harness: node %s was deleted: its machine is gone, its pods' processes killed\n", spec.Name)
				a.vanish()
			}
		},
	})
	podInformers.Start(ctx.Done())
	nodeInformers.Start(ctx.Done())
	go a.heartbeat()
	return a, nil
}

func (a *nodeAgent) conditions(status corev1.ConditionStatus, now metav1.Time) []corev1.NodeCondition {
	cond := func(t corev1.NodeConditionType, s corev1.ConditionStatus, reason, msg string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: t, Status: s, Reason: reason, Message: msg, LastHeartbeatTime: now, LastTransitionTime: now}
	}
	return []corev1.NodeCondition{
		cond(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
		cond(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
		cond(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
		cond(corev1.NodeReady, status, "KubeletReady", "k8s-harness node agent is posting ready status"),
	}
}

func (a *nodeAgent) register() error {
	capacity, err := quantities(a.spec.Capacity, map[string]string{"cpu": "4", "memory": "16Gi", "pods": "110", "ephemeral-storage": "100Gi"})
	if err != nil {
		return err
	}
	allocatable := capacity
	if a.spec.Allocatable != nil {
		if allocatable, err = quantities(a.spec.Allocatable, nil); err != nil {
			return err
		}
	}
	labels := map[string]string{
		"kubernetes.io/hostname": a.spec.Name,
		"kubernetes.io/os":       "linux",
		"kubernetes.io/arch":     "amd64",
	}
	for k, v := range a.spec.Labels {
		labels[k] = v
	}
	now := metav1.Now()
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: a.spec.Name, Labels: labels,
			Annotations: map[string]string{"k8s-harness/agent": "true"}},
		Spec: corev1.NodeSpec{Taints: a.spec.Taints},
		Status: corev1.NodeStatus{
			Capacity:    capacity,
			Allocatable: allocatable,
			Conditions:  a.conditions(corev1.ConditionTrue, now),
			Addresses: []corev1.NodeAddress{
				{Type: corev1.NodeInternalIP, Address: a.ip},
				{Type: corev1.NodeHostName, Address: a.spec.Name},
			},
			DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: kubeletPort}},
			NodeInfo: corev1.NodeSystemInfo{
				KubeletVersion:          "v1.37.2",
				OperatingSystem:         "linux",
				Architecture:            "amd64",
				ContainerRuntimeVersion: "k8s-harness://processes",
				OSImage:                 "k8s-harness node agent",
			},
		},
	}
	created, err := a.h.client.CoreV1().Nodes().Create(a.ctx, node, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("register: %w", err)
	}
	// Create may drop the status; write it as the kubelet does after.
	created.Status = node.Status
	if _, err := a.h.client.CoreV1().Nodes().UpdateStatus(a.ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("node status: %w", err)
	}
	return a.renewLease()
}

func (a *nodeAgent) renewLease() error {
	leases := a.h.client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	now := metav1.NewMicroTime(time.Now())
	l, err := leases.Get(a.ctx, a.spec.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		node, nerr := a.h.client.CoreV1().Nodes().Get(a.ctx, a.spec.Name, metav1.GetOptions{})
		if nerr != nil {
			return nerr
		}
		_, err = leases.Create(a.ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: a.spec.Name, Namespace: corev1.NamespaceNodeLease,
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(a.spec.Name), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &now},
		}, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	l.Spec.RenewTime = &now
	_, err = leases.Update(a.ctx, l, metav1.UpdateOptions{})
	return err
}

// heartbeat: the Lease every second, the Ready condition every 4 s, as
// long as the node is neither frozen nor gone.
func (a *nodeAgent) heartbeat() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	n := 0
	for {
		select {
		case <-a.ctx.Done():
			return
		case <-t.C:
		}
		if a.frozen.Load() || a.gone.Load() {
			continue
		}
		_ = a.renewLease()
		n++
		if n%4 == 0 {
			a.postReady()
		}
	}
}

func (a *nodeAgent) postReady() {
	node, err := a.h.client.CoreV1().Nodes().Get(a.ctx, a.spec.Name, metav1.GetOptions{})
	if err != nil {
		return
	}
	now := metav1.Now()
	fresh := a.conditions(corev1.ConditionTrue, now)
	for i, c := range fresh {
		for _, old := range node.Status.Conditions {
			if old.Type == c.Type && old.Status == c.Status {
				fresh[i].LastTransitionTime = old.LastTransitionTime
			}
		}
	}
	node.Status.Conditions = fresh
	_, _ = a.h.client.CoreV1().Nodes().UpdateStatus(a.ctx, node, metav1.UpdateOptions{})
}

func (a *nodeAgent) setFrozen(frozen bool) {
	was := a.frozen.Swap(frozen)
	if was && !frozen {
		// Back: heartbeat now, then catch up with what happened to the
		// pods meanwhile and post their status.
		_ = a.renewLease()
		a.postReady()
		for _, o := range a.podStore.List() {
			a.podEvent(o)
		}
		a.mu.Lock()
		runs := make([]*podRun, 0, len(a.pods))
		for _, pr := range a.pods {
			runs = append(runs, pr)
		}
		a.mu.Unlock()
		for _, pr := range runs {
			pr.kick()
		}
	}
}

// vanish: the machine is gone. Every pod process is SIGKILLed at once, the
// agent stops (no status, no heartbeats), its address is free again.
// Returns the PIDs it killed.
func (a *nodeAgent) vanish() []int {
	a.gone.Store(true)
	a.mu.Lock()
	runs := make([]*podRun, 0, len(a.pods))
	for _, pr := range a.pods {
		runs = append(runs, pr)
	}
	a.mu.Unlock()
	var killed []int
	for _, pr := range runs {
		killed = append(killed, pr.killNow()...)
	}
	a.stop()
	if a.server != nil {
		_ = a.server.Close()
	}
	a.h.forgetNode(a.spec.Name)
	sort.Ints(killed)
	return killed
}

func (a *nodeAgent) allocIP() (string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := 0; i < 253; i++ {
		n := a.nextIP
		a.nextIP++
		if a.nextIP > 254 {
			a.nextIP = 2
		}
		ip := fmt.Sprintf("127.%d.%d.%d", a.h.octet, a.index, n)
		if !a.ipUsed[ip] {
			a.ipUsed[ip] = true
			return ip, nil
		}
	}
	return "", errors.New("no pod IP left on this node (253 pods)")
}

func (a *nodeAgent) freeIP(ip string) {
	a.mu.Lock()
	delete(a.ipUsed, ip)
	a.mu.Unlock()
}

// podEvent: a pod bound here was added, changed or deleted.
func (a *nodeAgent) podEvent(o any) {
	if a.frozen.Load() || a.gone.Load() {
		return
	}
	if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = t.Obj
	}
	pod, ok := o.(*corev1.Pod)
	if !ok {
		return
	}
	_, exists, _ := a.podStore.Get(pod)
	a.mu.Lock()
	pr := a.pods[pod.UID]
	a.mu.Unlock()
	switch {
	case !exists:
		// The object is gone (deleted with grace 0, or by podgc): its
		// processes go at once.
		if pr != nil {
			pr.killNow()
			a.forgetPod(pr)
		}
	case pr != nil:
		pr.update(pod)
	case pod.DeletionTimestamp != nil:
		// Deleted before it ever ran here (or finished before this agent
		// saw it): nothing to stop, confirm the deletion.
		_ = a.h.client.CoreV1().Pods(pod.Namespace).Delete(a.ctx, pod.Name,
			metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0), Preconditions: metav1.NewUIDPreconditions(string(pod.UID))})
	case pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed:
		// Finished before (not by this agent): nothing to run.
	default:
		pr := newPodRun(a, pod)
		a.mu.Lock()
		a.pods[pod.UID] = pr
		a.mu.Unlock()
		go pr.run()
	}
}

func (a *nodeAgent) forgetPod(pr *podRun) {
	a.mu.Lock()
	if a.pods[pr.uid] == pr {
		delete(a.pods, pr.uid)
	}
	a.mu.Unlock()
}

func (a *nodeAgent) podByName(ns, name string) *podRun {
	a.mu.Lock()
	defer a.mu.Unlock()
	var found *podRun
	for _, pr := range a.pods {
		if pr.namespace == ns && pr.name == name {
			if found == nil || pr.started.After(found.started) {
				found = pr
			}
		}
	}
	return found
}

func (a *nodeAgent) describe() map[string]any {
	a.mu.Lock()
	pods := []string{}
	for _, pr := range a.pods {
		pods = append(pods, pr.namespace+"/"+pr.name)
	}
	a.mu.Unlock()
	sort.Strings(pods)
	return map[string]any{"name": a.spec.Name, "ip": a.ip, "frozen": a.frozen.Load(), "pods": pods}
}

// handler: the kubelet API paths the apiserver uses for pods/log and
// pods/exec; the rest answer 404.
func (a *nodeAgent) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	mux.HandleFunc("/containerLogs/{ns}/{pod}/{container}", a.serveLogs)
	mux.HandleFunc("/exec/{ns}/{pod}/{container}", a.serveExec)
	mux.HandleFunc("/exec/{ns}/{pod}/{uid}/{container}", a.serveExec)
	return mux
}

func podDirName(ns, name string, uid types.UID) string {
	return filepath.Join(ns, name+"_"+strings.SplitN(string(uid), "-", 2)[0])
}
