// Label patching: reading the own pod, fencing stale labels on other pods
// and adding or removing this pod's label with a guarded JSON patch.

package hagate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/go-openapi/jsonpointer"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// apiCtx bounds one API call so a hung connection cannot wedge the loop.
func (g *Gate) apiCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, g.cfg.RenewDeadline)
}

func (g *Gate) getPod(ctx context.Context) (*corev1.Pod, error) {
	ctx, cancel := g.apiCtx(ctx)
	defer cancel()
	return g.cfg.Client.CoreV1().Pods(g.cfg.Namespace).Get(ctx, g.cfg.PodName, metav1.GetOptions{})
}

// fence removes the label from every other non-terminating pod. Such a
// label is stale: we hold the Lease, so its owner is not the leader (its
// hagate crashed, its node died, or someone added it by hand).
func (g *Gate) fence(ctx context.Context) error {
	lctx, cancel := g.apiCtx(ctx)
	defer cancel()
	list, err := g.cfg.Client.CoreV1().Pods(g.cfg.Namespace).List(lctx, metav1.ListOptions{
		LabelSelector: g.cfg.LabelKey + "=true",
	})
	if err != nil {
		g.cfg.Metrics.apiErrors.WithLabelValues("list").Inc()
		return fmt.Errorf("list active pods: %w", err)
	}
	for i := range list.Items {
		p := &list.Items[i]
		if p.Name == g.cfg.PodName || p.DeletionTimestamp != nil {
			continue
		}
		if err := g.patchLabel(ctx, p, false); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return fmt.Errorf("remove stale label from pod %s: %w", p.Name, err)
		}
		g.cfg.Metrics.fixes.WithLabelValues("fence").Inc()
		g.cfg.Logger.Warn("removed stale active label from another pod", "pod", p.Name)
	}
	return nil
}

// patchLabel adds (value "true") or removes the label on pod with a JSON
// patch whose first op tests the resourceVersion we read, so a decision
// made on a stale read is rejected rather than applied.
func (g *Gate) patchLabel(ctx context.Context, pod *corev1.Pod, add bool) error {
	var (
		ctxPatch context.Context
		cancel   context.CancelFunc
	)
	if add {
		// Check leadership immediately before the write, and give the
		// request a deadline inside the Lease we hold: a patch delayed past
		// the point where a standby may take over is abandoned.
		until, ok := g.leaseValidUntil()
		if !ok || !g.holdsLease() {
			return errNotLeader
		}
		ctxPatch, cancel = context.WithDeadline(ctx, until)
	} else {
		ctxPatch, cancel = g.apiCtx(ctx)
	}
	defer cancel()
	data, err := labelPatch(pod, g.cfg.LabelKey, add)
	if err != nil {
		return err
	}
	_, err = g.cfg.Client.CoreV1().Pods(pod.Namespace).Patch(ctxPatch, pod.Name, types.JSONPatchType, data,
		metav1.PatchOptions{FieldManager: FieldManager})
	if err != nil {
		g.cfg.Metrics.apiErrors.WithLabelValues("patch").Inc()
		return fmt.Errorf("patch pod %s: %w", pod.Name, err)
	}
	if pod.Name == g.cfg.PodName {
		action, msg := "remove", "active label removed"
		if add {
			action, msg = "add", "active label added"
		}
		g.cfg.Metrics.fixes.WithLabelValues(action).Inc()
		g.cfg.Logger.Info(msg, "label", g.cfg.LabelKey, "pod", pod.Name)
	}
	return nil
}

var errNotLeader = errors.New("not holding the Lease")

// retryable reports errors worth an immediate retry with a fresh read:
// the resourceVersion test failed (the apiserver answers 422 for a failed
// JSON-patch test) or an optimistic-concurrency conflict.
func retryable(err error) bool {
	return apierrors.IsConflict(err) || apierrors.IsInvalid(err)
}

type jsonPatchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// labelPatch builds [test resourceVersion, add|remove label].
func labelPatch(pod *corev1.Pod, key string, add bool) ([]byte, error) {
	ops := []jsonPatchOp{{Op: "test", Path: "/metadata/resourceVersion", Value: pod.ResourceVersion}}
	path := "/metadata/labels/" + jsonpointer.Escape(key)
	switch {
	case add && pod.Labels == nil:
		ops = append(ops, jsonPatchOp{Op: "add", Path: "/metadata/labels", Value: map[string]string{key: "true"}})
	case add:
		// "add" on an existing member replaces it (RFC 6902 4.1).
		ops = append(ops, jsonPatchOp{Op: "add", Path: path, Value: "true"})
	default:
		if _, ok := pod.Labels[key]; !ok {
			return nil, fmt.Errorf("pod %s has no label %s", pod.Name, key)
		}
		ops = append(ops, jsonPatchOp{Op: "remove", Path: path})
	}
	return json.Marshal(ops)
}
