package main

// The Kueue checks of selftest (with --kueue): a pod group of two under a
// ClusterQueue with one pod's worth of quota stays gated, whole; with the
// quota raised it is admitted whole and both pods run; deleted, its pods
// (Kueue's finalizer on them) and its Workload go.

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
)

var (
	clusterQueueGVR = schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "clusterqueues"}
	localQueueGVR   = schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "localqueues"}
	workloadGVR     = schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "workloads"}
)

func obj(v map[string]any) *unstructured.Unstructured { return &unstructured.Unstructured{Object: v} }

func (t *selftest) runKueue() {
	dyn, err := dynamic.NewForConfig(t.config)
	if !t.check("kueue: dynamic client", err) {
		return
	}
	ctx := t.ctx
	_, err = dyn.Resource(flavorGVR).Create(ctx, obj(map[string]any{
		"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
		"metadata": map[string]any{"name": "default-flavor"},
	}), metav1.CreateOptions{})
	if err == nil {
		_, err = dyn.Resource(clusterQueueGVR).Create(ctx, obj(map[string]any{
			"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
			"metadata": map[string]any{"name": "cq"},
			"spec": map[string]any{
				"namespaceSelector": map[string]any{},
				"resourceGroups": []any{map[string]any{
					"coveredResources": []any{"cpu"},
					"flavors": []any{map[string]any{"name": "default-flavor", "resources": []any{
						map[string]any{"name": "cpu", "nominalQuota": "1"},
					}}},
				}},
			},
		}), metav1.CreateOptions{})
	}
	if err == nil {
		_, err = dyn.Resource(localQueueGVR).Namespace("default").Create(ctx, obj(map[string]any{
			"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
			"metadata": map[string]any{"name": "lq", "namespace": "default"},
			"spec":     map[string]any{"clusterQueue": "cq"},
		}), metav1.CreateOptions{})
	}
	if !t.check("kueue: a ResourceFlavor, a ClusterQueue with 1 cpu, a LocalQueue (through Kueue's webhooks)", err) {
		return
	}
	core := t.client.CoreV1()
	names := []string{"grp-0", "grp-1"}
	for _, n := range names {
		p := pod(n, "", corev1.RestartPolicyNever, "sleep 300")
		p.Labels = map[string]string{"kueue.x-k8s.io/queue-name": "lq", "kueue.x-k8s.io/pod-group-name": "grp"}
		// Not retriable: without it Kueue waits for replacements of the
		// group's failed (deleted) pods, keeping their finalizers and the
		// Workload's quota.
		p.Annotations = map[string]string{"kueue.x-k8s.io/pod-group-total-count": "2", "kueue.x-k8s.io/retriable-in-group": "false"}
		p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}
		if _, err = core.Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			break
		}
	}
	if !t.check("kueue: a pod group of 2 (1 cpu each) created", err) {
		return
	}
	gated := func(p *corev1.Pod) bool {
		for _, g := range p.Spec.SchedulingGates {
			if g.Name == "kueue.x-k8s.io/admission" {
				return true
			}
		}
		return false
	}
	// Kueue has seen the group (its Workload says why it waits) while both
	// pods stay gated.
	var why string
	deadline := time.Now().Add(30 * time.Second)
	err = fmt.Errorf("no Workload for the group says why it waits within 30 s")
	for time.Now().Before(deadline) {
		if why = workloadMessage(t, dyn, "QuotaReserved"); strings.Contains(why, "insufficient") {
			err = nil
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if err == nil {
		time.Sleep(2 * time.Second)
		for _, n := range names {
			p, gerr := core.Pods("default").Get(ctx, n, metav1.GetOptions{})
			switch {
			case gerr != nil:
				err = gerr
			case !gated(p):
				err = fmt.Errorf("pod %s is not gated (gates %v, phase %s, node %q)", n, p.Spec.SchedulingGates, p.Status.Phase, p.Spec.NodeName)
			case p.Spec.NodeName != "":
				err = fmt.Errorf("pod %s was bound to %s", n, p.Spec.NodeName)
			}
		}
	}
	t.check(fmt.Sprintf("kueue: over quota, both pods stay gated, none bound (Workload: %q)", why), err)

	patch := []byte(`[{"op":"replace","path":"/spec/resourceGroups/0/flavors/0/resources/0/nominalQuota","value":"2"}]`)
	_, err = dyn.Resource(clusterQueueGVR).Patch(ctx, "cq", types.JSONPatchType, patch, metav1.PatchOptions{})
	start := time.Now()
	if err == nil {
		for _, n := range names {
			if _, err = t.waitPod(n, 60*time.Second, podRunning); err != nil {
				break
			}
		}
	}
	if err == nil && workloadCondition(t, dyn, "Admitted") != "True" {
		err = fmt.Errorf("the group's Workload is not Admitted")
	}
	t.check(fmt.Sprintf("kueue: quota raised to 2 cpu, the group admitted whole, both pods Running (%.1fs)", time.Since(start).Seconds()), err)

	start = time.Now()
	for _, n := range names {
		if derr := core.Pods("default").Delete(ctx, n, metav1.DeleteOptions{}); derr != nil {
			err = derr
		}
	}
	if err == nil {
		deadline := time.Now().Add(60 * time.Second)
		for {
			var left []string
			for _, n := range names {
				if p, gerr := core.Pods("default").Get(ctx, n, metav1.GetOptions{}); !apierrors.IsNotFound(gerr) {
					if p != nil {
						left = append(left, fmt.Sprintf("pod %s (%s, finalizers %v, deleting %v)", n, p.Status.Phase, p.Finalizers, p.DeletionTimestamp != nil))
					} else {
						left = append(left, fmt.Sprintf("pod %s: %v", n, gerr))
					}
				}
			}
			wls, lerr := dyn.Resource(workloadGVR).Namespace("default").List(ctx, metav1.ListOptions{})
			if lerr != nil {
				left = append(left, lerr.Error())
			} else {
				for _, w := range wls.Items {
					left = append(left, fmt.Sprintf("Workload %s (finalizers %v, deleting %v)", w.GetName(), w.GetFinalizers(), w.GetDeletionTimestamp() != nil))
				}
			}
			if len(left) == 0 {
				err = nil
				break
			}
			if time.Now().After(deadline) {
				err = fmt.Errorf("after 60 s still there: %s", strings.Join(left, "; "))
				break
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	t.check(fmt.Sprintf("kueue: the group deleted, its pods (finalized by Kueue) and Workload go (%.1fs)", time.Since(start).Seconds()), err)
}

// workloadCondition / workloadMessage: of the one Workload in default.
func workloadCondition(t *selftest, dyn dynamic.Interface, typ string) string {
	c := workloadCond(t, dyn, typ)
	if c == nil {
		return ""
	}
	s, _ := c["status"].(string)
	return s
}

func workloadMessage(t *selftest, dyn dynamic.Interface, typ string) string {
	c := workloadCond(t, dyn, typ)
	if c == nil {
		return ""
	}
	s, _ := c["message"].(string)
	return s
}

func workloadCond(t *selftest, dyn dynamic.Interface, typ string) map[string]any {
	wls, err := dyn.Resource(workloadGVR).Namespace("default").List(t.ctx, metav1.ListOptions{})
	if err != nil || len(wls.Items) != 1 {
		return nil
	}
	conds, _, _ := unstructured.NestedSlice(wls.Items[0].Object, "status", "conditions")
	for _, c := range conds {
		m := c.(map[string]any)
		if m["type"] == typ {
			return m
		}
	}
	return nil
}
