package main

// A pod on a node agent: its containers as local processes, each in a
// process group of its own, under the pod's working directory and loopback
// address; the status the kubelet would post; its logs and exec.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	remotecommandserver "k8s.io/cri-streaming/pkg/streaming/remotecommand"
	"k8s.io/kubernetes/pkg/api/v1/resource"
	"k8s.io/kubernetes/pkg/fieldpath"
	"k8s.io/kubernetes/third_party/forked/golang/expansion"
	utilexec "k8s.io/utils/exec"
	"k8s.io/utils/ptr"
)

type containerState int

const (
	waiting containerState = iota
	running
	terminated
)

type containerRun struct {
	spec     corev1.Container
	init     bool
	state    containerState
	reason   string // waiting or terminated reason
	message  string
	pid      int
	restarts int32
	started  time.Time
	finished time.Time
	exitCode int32
	last     *corev1.ContainerStateTerminated
	logPath  string // the current (or last) instance's log
	env      []string
}

type podEvent struct {
	exited    *containerRun
	pid       int
	code      int32
	restart   *containerRun
	terminate bool
	kick      bool
}

type podRun struct {
	a         *nodeAgent
	uid       types.UID
	namespace string
	name      string
	started   time.Time
	events    chan podEvent

	mu          sync.Mutex
	pod         *corev1.Pod
	ip          string
	dir         string
	containers  []*containerRun // init containers first
	phase       corev1.PodPhase
	killed      bool // killNow: no restarts, no graceful anything
	terminating bool
	execs       map[int]bool
	done        chan struct{}
}

func newPodRun(a *nodeAgent, pod *corev1.Pod) *podRun {
	pr := &podRun{a: a, uid: pod.UID, namespace: pod.Namespace, name: pod.Name, started: time.Now(),
		events: make(chan podEvent, 64), pod: pod.DeepCopy(), phase: corev1.PodPending,
		execs: map[int]bool{}, done: make(chan struct{})}
	for _, c := range pod.Spec.InitContainers {
		pr.containers = append(pr.containers, &containerRun{spec: c, init: true, reason: "PodInitializing"})
	}
	for _, c := range pod.Spec.Containers {
		reason := "ContainerCreating"
		if len(pod.Spec.InitContainers) > 0 {
			reason = "PodInitializing"
		}
		pr.containers = append(pr.containers, &containerRun{spec: c, reason: reason})
	}
	return pr
}

func (pr *podRun) send(e podEvent) {
	select {
	case pr.events <- e:
	case <-pr.done:
	}
}

// update: the pod object changed (a deletion timestamp is what matters).
func (pr *podRun) update(pod *corev1.Pod) {
	pr.mu.Lock()
	pr.pod = pod.DeepCopy()
	pr.mu.Unlock()
	if pod.DeletionTimestamp != nil {
		pr.send(podEvent{terminate: true})
	}
}

func (pr *podRun) kick() { pr.send(podEvent{kick: true}) }

func (pr *podRun) run() {
	defer close(pr.done)
	ip, err := pr.a.allocIP()
	if err != nil {
		pr.mu.Lock()
		pr.phase = corev1.PodFailed
		pr.mu.Unlock()
		pr.pushStatus()
		return
	}
	defer pr.a.freeIP(ip)
	dir := filepath.Join(pr.a.h.dir, "pods", podDirName(pr.namespace, pr.name, pr.uid))
	_ = os.MkdirAll(filepath.Join(dir, "logs"), 0o755)
	pr.mu.Lock()
	pr.ip, pr.dir = ip, dir
	deleting := pr.pod.DeletionTimestamp != nil
	pr.mu.Unlock()
	pr.pushStatus()

	restartPolicy := pr.pod.Spec.RestartPolicy
	next := 0 // the next init container to run; len(init) once they all succeeded
	nInit := len(pr.pod.Spec.InitContainers)
	startMain := func() {
		for _, c := range pr.containers[nInit:] {
			pr.startContainer(c)
		}
		pr.mu.Lock()
		pr.phase = corev1.PodRunning
		pr.mu.Unlock()
	}
	if deleting {
		pr.send(podEvent{terminate: true})
	} else if nInit > 0 {
		pr.startContainer(pr.containers[0])
	} else {
		startMain()
	}
	pr.pushStatus()
	var graceTimer <-chan time.Time
	for {
		pr.mu.Lock()
		allDone := true
		for _, c := range pr.containers {
			if c.state == running {
				allDone = false
			}
		}
		killed, terminating := pr.killed, pr.terminating
		pr.mu.Unlock()
		if (killed || terminating) && allDone {
			break
		}
		var e podEvent
		select {
		case e = <-pr.events:
		case <-graceTimer:
			pr.signalAll(syscall.SIGKILL)
			graceTimer = nil
			continue
		case <-pr.a.ctx.Done():
			pr.killNow()
			pr.waitExits()
			return
		}
		switch {
		case e.kick:
		case e.terminate:
			pr.mu.Lock()
			if pr.terminating || pr.killed {
				pr.mu.Unlock()
				continue
			}
			pr.terminating = true
			grace := int64(30)
			if pr.pod.DeletionGracePeriodSeconds != nil {
				grace = *pr.pod.DeletionGracePeriodSeconds
			}
			for _, c := range pr.containers {
				if c.state == waiting {
					c.reason = ""
				}
			}
			pr.mu.Unlock()
			pr.signalAll(syscall.SIGTERM)
			graceTimer = time.After(time.Duration(grace) * time.Second)
		case e.restart != nil:
			pr.mu.Lock()
			stop := pr.terminating || pr.killed
			pr.mu.Unlock()
			if !stop {
				pr.startContainer(e.restart)
			}
		case e.exited != nil:
			c := e.exited
			pr.mu.Lock()
			if c.pid != e.pid {
				pr.mu.Unlock()
				continue
			}
			c.state, c.exitCode, c.finished = terminated, e.code, time.Now()
			c.reason = "Completed"
			if e.code != 0 {
				c.reason = "Error"
			}
			stop := pr.terminating || pr.killed
			again := !stop && (restartPolicy == corev1.RestartPolicyAlways && !c.init ||
				restartPolicy != corev1.RestartPolicyNever && e.code != 0)
			pr.mu.Unlock()
			switch {
			case again:
				pr.mu.Lock()
				c.last = c.terminatedState()
				c.state, c.reason, c.message = waiting, "CrashLoopBackOff", fmt.Sprintf("back-off restarting failed container %s", c.spec.Name)
				c.restarts++
				backoff := time.Duration(1<<min(c.restarts-1, 4)) * time.Second
				pr.mu.Unlock()
				time.AfterFunc(backoff, func() { pr.send(podEvent{restart: c}) })
			case stop:
			case c.init && e.code == 0:
				next++
				if next < nInit {
					pr.startContainer(pr.containers[next])
				} else {
					startMain()
				}
			case c.init:
				// restartPolicy Never and an init container failed.
				pr.mu.Lock()
				pr.phase = corev1.PodFailed
				pr.mu.Unlock()
			default:
				pr.mu.Lock()
				finished, failed := true, false
				for _, m := range pr.containers[nInit:] {
					if m.state != terminated {
						finished = false
					} else if m.exitCode != 0 {
						failed = true
					}
				}
				if finished {
					pr.phase = corev1.PodSucceeded
					if failed {
						pr.phase = corev1.PodFailed
					}
				}
				pr.mu.Unlock()
			}
		}
		pr.pushStatus()
	}
	// Every process is gone: the pod was deleted (or its node vanished).
	pr.mu.Lock()
	killed := pr.killed
	pr.mu.Unlock()
	if killed {
		return
	}
	// As the kubelet (1.27+) does, a deleted pod whose containers have all
	// stopped is put in a terminal phase before its object goes: Succeeded
	// when every container exited 0, else Failed. Controllers wait for it
	// (Kueue lifts its finalizer from a pod only once it is terminal).
	pr.mu.Lock()
	if pr.phase != corev1.PodSucceeded && pr.phase != corev1.PodFailed {
		pr.phase = corev1.PodSucceeded
		for _, c := range pr.containers[len(pr.pod.Spec.InitContainers):] {
			if c.state != terminated || c.exitCode != 0 {
				pr.phase = corev1.PodFailed
			}
		}
	}
	pr.mu.Unlock()
	pr.pushStatus()
	err = pr.a.h.client.CoreV1().Pods(pr.namespace).Delete(pr.a.ctx, pr.name,
		metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0), Preconditions: metav1.NewUIDPreconditions(string(pr.uid))})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		fmt.Fprintf(os.Stderr, "k8s-harness: node %s: delete pod %s/%s: %v\n", pr.a.spec.Name, pr.namespace, pr.name, err)
	}
}

func (c *containerRun) terminatedState() *corev1.ContainerStateTerminated {
	return &corev1.ContainerStateTerminated{ExitCode: c.exitCode, Reason: c.reason, Message: c.message,
		StartedAt: metav1.NewTime(c.started), FinishedAt: metav1.NewTime(c.finished),
		ContainerID: "harness://" + strconv.Itoa(c.pid)}
}

// startContainer: one instance of c, as a process group of its own.
func (pr *podRun) startContainer(c *containerRun) {
	pr.mu.Lock()
	pod := pr.pod.DeepCopy()
	ip, dir := pr.ip, pr.dir
	pr.mu.Unlock()
	fail := func(reason string, err error) {
		pr.mu.Lock()
		c.state, c.exitCode, c.reason, c.message = terminated, 128, reason, err.Error()
		c.started, c.finished = time.Now(), time.Now()
		c.pid = -int(time.Now().UnixNano() % 1e9) // no process; a pid that matches no exit
		pr.mu.Unlock()
		// As if it exited 128: the restart policy decides what follows.
		pr.events <- podEvent{exited: c, pid: c.pid, code: 128}
	}
	env, err := pr.containerEnv(pod, &c.spec, ip)
	if err != nil {
		fail("CreateContainerConfigError", err)
		return
	}
	mapping := expansion.MappingFuncFor(envMap(env))
	var argv []string
	for _, s := range append(append([]string{}, c.spec.Command...), c.spec.Args...) {
		argv = append(argv, expansion.Expand(s, mapping))
	}
	if len(argv) == 0 {
		fail("StartError", fmt.Errorf("container %s has no command (images are not run here: give command/args)", c.spec.Name))
		return
	}
	logPath := filepath.Join(dir, "logs", fmt.Sprintf("%s-%d.log", c.spec.Name, c.restarts))
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		fail("StartError", err)
		return
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir, cmd.Env = dir, env
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := spawn(cmd); err != nil {
		logf.Close()
		pr.mu.Lock()
		c.logPath = logPath
		pr.mu.Unlock()
		fail("StartError", err)
		return
	}
	logf.Close()
	pid := cmd.Process.Pid
	pr.a.h.recordPgid(pid)
	pr.mu.Lock()
	c.state, c.reason, c.message = running, "", ""
	c.pid, c.started, c.logPath, c.env = pid, time.Now(), logPath, env
	pr.mu.Unlock()
	go func() {
		_ = cmd.Wait()
		// The container is its main process: what it left behind in its
		// group goes with it.
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		code := int32(cmd.ProcessState.ExitCode())
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			code = 128 + int32(ws.Signal())
		}
		pr.events <- podEvent{exited: c, pid: pid, code: code}
	}()
}

func envMap(env []string) map[string]string {
	m := map[string]string{}
	for _, kv := range env {
		if i := bytes.IndexByte([]byte(kv), '='); i > 0 {
			m[kv[:i]] = kv[i+1:]
		}
	}
	return m
}

// containerEnv: a base (PATH, LANG, TZ of the harness; HOME the pod's
// directory; HOSTNAME the pod's name; the API's address as in-cluster
// clients expect it; HARNESS_POD_IP), then envFrom, then env with
// $(VAR) expansion and valueFrom resolved, as the kubelet does.
func (pr *podRun) containerEnv(pod *corev1.Pod, c *corev1.Container, ip string) ([]string, error) {
	ctx := pr.a.ctx
	core := pr.a.h.client.CoreV1()
	var order []string
	vals := map[string]string{}
	set := func(k, v string) {
		if _, ok := vals[k]; !ok {
			order = append(order, k)
		}
		vals[k] = v
	}
	for _, k := range []string{"PATH", "LANG", "LC_ALL", "TZ", "USER", "LOGNAME", "SHELL"} {
		if v, ok := os.LookupEnv(k); ok {
			set(k, v)
		}
	}
	pr.mu.Lock()
	dir := pr.dir
	pr.mu.Unlock()
	set("HOME", dir)
	set("HOSTNAME", pod.Name)
	set("KUBERNETES_SERVICE_HOST", "127.0.0.1")
	set("KUBERNETES_SERVICE_PORT", strconv.Itoa(pr.a.h.apiPort))
	set("HARNESS_POD_IP", ip)
	set("HARNESS_NODE_NAME", pr.a.spec.Name)
	for _, from := range c.EnvFrom {
		var data map[string]string
		switch {
		case from.SecretRef != nil:
			s, err := core.Secrets(pod.Namespace).Get(ctx, from.SecretRef.Name, metav1.GetOptions{})
			if err != nil {
				if ptr.Deref(from.SecretRef.Optional, false) && apierrors.IsNotFound(err) {
					continue
				}
				return nil, fmt.Errorf("secret %q: %w", from.SecretRef.Name, err)
			}
			data = map[string]string{}
			for k, v := range s.Data {
				data[k] = string(v)
			}
		case from.ConfigMapRef != nil:
			cm, err := core.ConfigMaps(pod.Namespace).Get(ctx, from.ConfigMapRef.Name, metav1.GetOptions{})
			if err != nil {
				if ptr.Deref(from.ConfigMapRef.Optional, false) && apierrors.IsNotFound(err) {
					continue
				}
				return nil, fmt.Errorf("configmap %q: %w", from.ConfigMapRef.Name, err)
			}
			data = cm.Data
		}
		for k, v := range data {
			set(from.Prefix+k, v)
		}
	}
	podWithIP := pod.DeepCopy()
	podWithIP.Status.PodIP = ip
	podWithIP.Status.HostIP = pr.a.ip
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			set(e.Name, expansion.Expand(e.Value, expansion.MappingFuncFor(vals)))
			continue
		}
		v, err := pr.valueFrom(ctx, podWithIP, c, e.ValueFrom)
		if err != nil {
			return nil, fmt.Errorf("env %s: %w", e.Name, err)
		}
		if v != nil {
			set(e.Name, *v)
		}
	}
	out := make([]string, 0, len(order))
	for _, k := range order {
		out = append(out, k+"="+vals[k])
	}
	return out, nil
}

func (pr *podRun) valueFrom(ctx context.Context, pod *corev1.Pod, c *corev1.Container, from *corev1.EnvVarSource) (*string, error) {
	core := pr.a.h.client.CoreV1()
	switch {
	case from.FieldRef != nil:
		switch from.FieldRef.FieldPath {
		case "spec.nodeName":
			return ptr.To(pr.a.spec.Name), nil
		case "spec.serviceAccountName":
			return ptr.To(pod.Spec.ServiceAccountName), nil
		case "status.podIP", "status.podIPs":
			return ptr.To(pod.Status.PodIP), nil
		case "status.hostIP", "status.hostIPs":
			return ptr.To(pod.Status.HostIP), nil
		}
		v, err := fieldpath.ExtractFieldPathAsString(pod, from.FieldRef.FieldPath)
		if err != nil {
			return nil, err
		}
		return &v, nil
	case from.ResourceFieldRef != nil:
		v, err := resource.ExtractContainerResourceValue(from.ResourceFieldRef, c)
		if err != nil {
			return nil, err
		}
		return &v, nil
	case from.SecretKeyRef != nil:
		ref := from.SecretKeyRef
		s, err := core.Secrets(pod.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			if ptr.Deref(ref.Optional, false) && apierrors.IsNotFound(err) {
				return nil, nil
			}
			return nil, fmt.Errorf("secret %q: %w", ref.Name, err)
		}
		v, ok := s.Data[ref.Key]
		if !ok {
			if ptr.Deref(ref.Optional, false) {
				return nil, nil
			}
			return nil, fmt.Errorf("secret %q has no key %q", ref.Name, ref.Key)
		}
		return ptr.To(string(v)), nil
	case from.ConfigMapKeyRef != nil:
		ref := from.ConfigMapKeyRef
		cm, err := core.ConfigMaps(pod.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			if ptr.Deref(ref.Optional, false) && apierrors.IsNotFound(err) {
				return nil, nil
			}
			return nil, fmt.Errorf("configmap %q: %w", ref.Name, err)
		}
		v, ok := cm.Data[ref.Key]
		if !ok {
			if ptr.Deref(ref.Optional, false) {
				return nil, nil
			}
			return nil, fmt.Errorf("configmap %q has no key %q", ref.Name, ref.Key)
		}
		return &v, nil
	}
	return nil, nil
}

// signalAll: sig to every running container's process group and every
// exec'd command's.
func (pr *podRun) signalAll(sig syscall.Signal) []int {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	var pids []int
	for _, c := range pr.containers {
		if c.state == running && c.pid > 0 {
			_ = syscall.Kill(-c.pid, sig)
			pids = append(pids, c.pid)
		}
	}
	for pgid := range pr.execs {
		_ = syscall.Kill(-pgid, sig)
	}
	return pids
}

// killNow: SIGKILL everything at once (node gone, object gone); no status
// is posted after. Returns the containers' PIDs.
func (pr *podRun) killNow() []int {
	pr.mu.Lock()
	pr.killed = true
	pr.mu.Unlock()
	pids := pr.signalAll(syscall.SIGKILL)
	pr.send(podEvent{kick: true})
	return pids
}

func (pr *podRun) waitExits() {
	deadline := time.After(5 * time.Second)
	for {
		pr.mu.Lock()
		alive := false
		for _, c := range pr.containers {
			if c.state == running {
				alive = true
			}
		}
		pr.mu.Unlock()
		if !alive {
			return
		}
		select {
		case e := <-pr.events:
			if e.exited != nil {
				pr.mu.Lock()
				if e.exited.pid == e.pid {
					e.exited.state = terminated
				}
				pr.mu.Unlock()
			}
		case <-deadline:
			return
		}
	}
}

func (c *containerRun) status(podIP string) corev1.ContainerStatus {
	s := corev1.ContainerStatus{Name: c.spec.Name, Image: c.spec.Image, ImageID: "harness://" + c.spec.Image,
		RestartCount: c.restarts, LastTerminationState: corev1.ContainerState{Terminated: c.last}}
	if s.Image == "" {
		s.Image = "none"
	}
	switch c.state {
	case waiting:
		reason := c.reason
		if reason == "" {
			reason = "ContainerCreating"
		}
		s.State.Waiting = &corev1.ContainerStateWaiting{Reason: reason, Message: c.message}
		s.Started = ptr.To(false)
	case running:
		s.State.Running = &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(c.started)}
		s.Ready, s.Started = true, ptr.To(true)
		s.ContainerID = "harness://" + strconv.Itoa(c.pid)
	case terminated:
		s.State.Terminated = c.terminatedState()
		s.Started = ptr.To(false)
		s.ContainerID = s.State.Terminated.ContainerID
	}
	if c.init && c.state == terminated && c.exitCode == 0 {
		s.Ready = true
	}
	return s
}

// pushStatus posts the pod's status as this agent sees it (not while the
// node is frozen or gone: kick posts it on thaw).
func (pr *podRun) pushStatus() {
	if pr.a.frozen.Load() || pr.a.gone.Load() {
		return
	}
	pr.mu.Lock()
	if pr.killed {
		pr.mu.Unlock()
		return
	}
	nInit := len(pr.pod.Spec.InitContainers)
	var initStatuses, statuses []corev1.ContainerStatus
	initialized, ready := true, true
	for i, c := range pr.containers {
		s := c.status(pr.ip)
		if i < nInit {
			initStatuses = append(initStatuses, s)
			if !(c.state == terminated && c.exitCode == 0) {
				initialized = false
			}
		} else {
			statuses = append(statuses, s)
			if !s.Ready {
				ready = false
			}
		}
	}
	if pr.terminating || pr.phase == corev1.PodSucceeded || pr.phase == corev1.PodFailed {
		ready = false
	}
	phase, ip, hostIP, startTime := pr.phase, pr.ip, pr.a.ip, metav1.NewTime(pr.started)
	pr.mu.Unlock()
	cond := func(t corev1.PodConditionType, ok bool) corev1.PodCondition {
		s := corev1.ConditionFalse
		if ok {
			s = corev1.ConditionTrue
		}
		return corev1.PodCondition{Type: t, Status: s}
	}
	ours := []corev1.PodCondition{
		cond(corev1.PodReadyToStartContainers, ip != ""),
		cond(corev1.PodInitialized, initialized),
		cond(corev1.ContainersReady, ready),
		cond(corev1.PodReady, ready),
	}
	pods := pr.a.h.client.CoreV1().Pods(pr.namespace)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pod, err := pods.Get(pr.a.ctx, pr.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if pod.UID != pr.uid {
			return nil
		}
		st := &pod.Status
		now := metav1.Now()
		var conds []corev1.PodCondition
		for _, c := range st.Conditions {
			mine := false
			for _, o := range ours {
				mine = mine || o.Type == c.Type
			}
			if !mine {
				conds = append(conds, c)
			}
		}
		for _, o := range ours {
			o.LastTransitionTime = now
			for _, c := range st.Conditions {
				if c.Type == o.Type && c.Status == o.Status {
					o.LastTransitionTime = c.LastTransitionTime
				}
			}
			conds = append(conds, o)
		}
		st.Conditions = conds
		if st.Phase != corev1.PodSucceeded && st.Phase != corev1.PodFailed {
			st.Phase = phase
		}
		st.HostIP, st.HostIPs = hostIP, []corev1.HostIP{{IP: hostIP}}
		if ip != "" {
			st.PodIP, st.PodIPs = ip, []corev1.PodIP{{IP: ip}}
		}
		st.StartTime = &startTime
		st.InitContainerStatuses, st.ContainerStatuses = initStatuses, statuses
		_, err = pods.UpdateStatus(pr.a.ctx, pod, metav1.UpdateOptions{})
		return err
	})
	if err != nil && !apierrors.IsNotFound(err) && pr.a.ctx.Err() == nil {
		fmt.Fprintf(os.Stderr, "k8s-harness: node %s: status of pod %s/%s: %v\n", pr.a.spec.Name, pr.namespace, pr.name, err)
	}
}

func (pr *podRun) describe() map[string]any {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	cs := map[string]any{}
	for _, c := range pr.containers {
		cs[c.spec.Name] = map[string]any{"pid": c.pid, "running": c.state == running, "restarts": c.restarts, "log": c.logPath}
	}
	return map[string]any{"namespace": pr.namespace, "name": pr.name, "uid": string(pr.uid), "node": pr.a.spec.Name,
		"ip": pr.ip, "dir": pr.dir, "phase": string(pr.phase), "containers": cs}
}

func (pr *podRun) container(name string) *containerRun {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	for _, c := range pr.containers {
		if c.spec.Name == name {
			return c
		}
	}
	return nil
}

// serveLogs: GET /containerLogs/{ns}/{pod}/{container}?follow=&tailLines=&limitBytes=&previous=
func (a *nodeAgent) serveLogs(w http.ResponseWriter, r *http.Request) {
	pr := a.podByName(r.PathValue("ns"), r.PathValue("pod"))
	if pr == nil {
		http.Error(w, "pod not found on this node", http.StatusNotFound)
		return
	}
	c := pr.container(r.PathValue("container"))
	if c == nil {
		http.Error(w, "container not found", http.StatusNotFound)
		return
	}
	q := r.URL.Query()
	pr.mu.Lock()
	path, restarts := c.logPath, c.restarts
	pr.mu.Unlock()
	if q.Get("previous") == "true" {
		if restarts == 0 {
			http.Error(w, fmt.Sprintf("previous terminated container %q in pod %q not found", c.spec.Name, pr.name), http.StatusBadRequest)
			return
		}
		path = filepath.Join(pr.dir, "logs", fmt.Sprintf("%s-%d.log", c.spec.Name, restarts-1))
	}
	if path == "" {
		http.Error(w, fmt.Sprintf("container %q in pod %q is waiting to start", c.spec.Name, pr.name), http.StatusBadRequest)
		return
	}
	f, err := os.Open(path)
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	defer f.Close()
	limit := int64(-1)
	if s := q.Get("limitBytes"); s != "" {
		limit, _ = strconv.ParseInt(s, 10, 64)
	}
	if s := q.Get("tailLines"); s != "" {
		n, _ := strconv.Atoi(s)
		data, _ := io.ReadAll(f)
		lines := bytes.SplitAfter(data, []byte("\n"))
		if len(lines) > 0 && len(lines[len(lines)-1]) == 0 {
			lines = lines[:len(lines)-1]
		}
		skip := 0
		if len(lines) > n {
			for _, l := range lines[:len(lines)-n] {
				skip += len(l)
			}
		}
		_, _ = f.Seek(int64(skip), io.SeekStart)
	}
	w.Header().Set("Content-Type", "text/plain")
	follow := q.Get("follow") == "true"
	flusher, _ := w.(http.Flusher)
	reader := bufio.NewReader(f)
	buf := make([]byte, 32*1024)
	for {
		n, err := reader.Read(buf)
		if n > 0 {
			if limit >= 0 && int64(n) > limit {
				n = int(limit)
			}
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			if limit >= 0 {
				limit -= int64(n)
				if limit <= 0 {
					return
				}
			}
			if flusher != nil {
				flusher.Flush()
			}
			continue
		}
		if err != io.EOF || !follow {
			return
		}
		// Follow: stop once this instance is over and its log fully read.
		pr.mu.Lock()
		over := c.logPath != path || c.state != running || pr.killed
		pr.mu.Unlock()
		if over {
			if n, _ := reader.Read(buf); n > 0 {
				_, _ = w.Write(buf[:n])
				continue
			}
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// serveExec: /exec/{ns}/{pod}/{container}?command=...&stdin=1&stdout=1&stderr=1&tty=1,
// through the kubelet's own remotecommand server (SPDY or websocket, as
// the apiserver asks).
func (a *nodeAgent) serveExec(w http.ResponseWriter, r *http.Request) {
	pr := a.podByName(r.PathValue("ns"), r.PathValue("pod"))
	if pr == nil {
		http.Error(w, "pod not found on this node", http.StatusNotFound)
		return
	}
	c := pr.container(r.PathValue("container"))
	if c == nil {
		http.Error(w, "container not found", http.StatusNotFound)
		return
	}
	opts, err := remotecommandserver.NewOptions(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	cmd := r.URL.Query()["command"]
	remotecommandserver.ServeExec(w, r, &executor{pr: pr, c: c}, pr.namespace+"/"+pr.name, string(pr.uid), c.spec.Name,
		cmd, opts, 4*time.Hour, 30*time.Second, remotecommandserver.SupportedStreamingProtocols)
}

type executor struct {
	pr *podRun
	c  *containerRun
}

// ExecInContainer runs cmd in the container's environment (its env, the
// pod's directory, the pod's address in HARNESS_POD_IP), in a process group
// of its own that goes when the pod goes. tty is not emulated.
func (e *executor) ExecInContainer(ctx context.Context, _ string, _ string, _ string, argv []string,
	in io.Reader, out, errw io.WriteCloser, _ bool, _ <-chan remotecommandserver.TerminalSize, _ time.Duration) error {
	if len(argv) == 0 {
		return fmt.Errorf("no command")
	}
	e.pr.mu.Lock()
	env, dir, state, killed := e.c.env, e.pr.dir, e.c.state, e.pr.killed || e.pr.terminating
	e.pr.mu.Unlock()
	if state != running || killed {
		return fmt.Errorf("container %s is not running", e.c.spec.Name)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir, cmd.Env = dir, env
	if out != nil {
		cmd.Stdout = out
	}
	if errw != nil {
		cmd.Stderr = errw
	}
	var stdin io.WriteCloser
	if in != nil {
		p, err := cmd.StdinPipe()
		if err != nil {
			return err
		}
		stdin = p
	}
	if err := spawn(cmd); err != nil {
		return &utilexec.CodeExitError{Err: err, Code: 126}
	}
	pgid := cmd.Process.Pid
	e.pr.a.h.recordPgid(pgid)
	e.pr.mu.Lock()
	e.pr.execs[pgid] = true
	e.pr.mu.Unlock()
	defer func() {
		e.pr.mu.Lock()
		delete(e.pr.execs, pgid)
		e.pr.mu.Unlock()
	}()
	if stdin != nil {
		// Not waited for: a command that ends before its input does must
		// not hang on a client that never closes stdin.
		go func() {
			_, _ = io.Copy(stdin, in)
			_ = stdin.Close()
		}()
	}
	stop := context.AfterFunc(ctx, func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) })
	defer stop()
	err := cmd.Wait()
	if stdin != nil {
		_ = stdin.Close()
	}
	if err == nil {
		return nil
	}
	if ee, ok := err.(*exec.ExitError); ok {
		code := ee.ExitCode()
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			code = 128 + int(ws.Signal())
		}
		return &utilexec.CodeExitError{Err: err, Code: code}
	}
	return err
}
