package sink

// This file: what the Writer knows of a ConfigMap's content. The
// controller does not cache ConfigMaps: it watches their metadata only (a
// cluster's ConfigMaps can be large and many, and only the few that routes
// write into matter), and the Writer keeps the content of the ConfigMaps
// it writes — as its last read or its last write left them — and reads a
// ConfigMap from the API server only when the metadata shows a version it
// does not know.

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// maxRemembered bounds the resourceVersion sets of a ConfigMap's writer;
// forgetting costs at most one GET.
const maxRemembered = 256

// configMapGVK is set on the metadata-only objects the Writer reads.
var configMapGVK = corev1.SchemeGroupVersion.WithKind("ConfigMap")

// Changes are the keys of a ConfigMap that changed since the last call of
// Seen: the new value, nil when the key was removed. All is set when the
// Writer had no earlier content to compare with (every key may have
// changed).
type Changes struct {
	Keys map[string]*string
	All  bool
}

// read returns the content of key to decide on; the caller holds cw.write
// and must not modify it. With fresh it is read from the API server. Else
// the metadata (Client: normally the manager's metadata-only cache) gives
// the current resourceVersion: the known content serves when it is that
// version or newer (the cache is behind our write), else the ConfigMap is
// read from the API server.
func (w *Writer) read(ctx context.Context, key client.ObjectKey, cw *cmWriter, fresh bool) (*corev1.ConfigMap, error) {
	cm, _, err := w.readKnown(ctx, key, cw, fresh)
	return cm, err
}

// readKnown is read, also saying whether the content was read from the
// API server just now.
func (w *Writer) readKnown(ctx context.Context, key client.ObjectKey, cw *cmWriter, fresh bool) (*corev1.ConfigMap, bool, error) {
	if !fresh && cw.content != nil {
		meta := &metav1.PartialObjectMetadata{}
		meta.SetGroupVersionKind(configMapGVK)
		if err := w.Client.Get(ctx, key, meta); err != nil {
			return nil, false, err
		}
		if rv := meta.ResourceVersion; rv == cw.content.ResourceVersion || cw.superseded[rv] {
			return cw.content, false, nil
		}
	}
	cm, err := w.readFresh(ctx, key, cw)
	return cm, err == nil, err
}

// readFresh reads key from the API server and makes it the known content.
func (w *Writer) readFresh(ctx context.Context, key client.ObjectKey, cw *cmWriter) (*corev1.ConfigMap, error) {
	reader := client.Reader(w.Client)
	if w.APIReader != nil {
		reader = w.APIReader
	}
	cm := &corev1.ConfigMap{}
	if err := reader.Get(ctx, key, cm); err != nil {
		return nil, err
	}
	cw.replace(cm)
	return cm, nil
}

// replace makes cm, read from the API server, the known content: the keys
// it holds differently from what we knew are changes for Seen, and every
// version we knew before is older. (A first read has nothing to compare
// with: whoever asks for the content next decides on it.)
func (cw *cmWriter) replace(cm *corev1.ConfigMap) {
	if old := cw.content; old != nil {
		if old.ResourceVersion != cm.ResourceVersion {
			cw.supersede(old.ResourceVersion)
		}
		for k, v := range cm.Data {
			if o, ok := old.Data[k]; !ok || o != v {
				cw.changed(k, &v)
			}
		}
		for k := range old.Data {
			if _, ok := cm.Data[k]; !ok {
				cw.changed(k, nil)
			}
		}
	}
	cw.content = cm
}

// wrote records our patch of set on base, which the API server answered
// with resourceVersion rv.
func (cw *cmWriter) wrote(base *corev1.ConfigMap, set map[string]*string, rv string) {
	next := base.DeepCopy()
	if next.Data == nil {
		next.Data = map[string]string{}
	}
	for k, v := range set {
		if v == nil {
			delete(next.Data, k)
		} else {
			next.Data[k] = *v
		}
		cw.changed(k, v)
	}
	next.ResourceVersion = rv
	cw.supersede(base.ResourceVersion)
	if cw.content != nil && cw.content != base {
		cw.supersede(cw.content.ResourceVersion)
	}
	cw.content = next
	if len(cw.ours) >= maxRemembered {
		cw.ours = nil
	}
	if cw.ours == nil {
		cw.ours = map[string]bool{}
	}
	cw.ours[rv] = true
}

func (cw *cmWriter) changed(k string, v *string) {
	if cw.changes.Keys == nil {
		cw.changes.Keys = map[string]*string{}
	}
	cw.changes.Keys[k] = v
}

// supersede records that rv is older than the known content.
func (cw *cmWriter) supersede(rv string) {
	if rv == "" {
		return
	}
	if len(cw.superseded) >= maxRemembered {
		cw.superseded = nil
	}
	if cw.superseded == nil {
		cw.superseded = map[string]bool{}
	}
	cw.superseded[rv] = true
}

// Seen is told that the ConfigMap ref (namespace/name) is now at
// resourceVersion rv (a watch event) and returns what changed in it since
// the last call: by our writes, and by others' — read from the API server
// when rv is a version the Writer neither wrote nor read. It waits for a
// write of ref in flight. A ConfigMap the Writer never read has no earlier
// content: All is set, and nothing is read.
func (w *Writer) Seen(ctx context.Context, ref, rv string) (Changes, error) {
	cw := w.cmWriter(ref)
	cw.write.Lock()
	defer cw.write.Unlock()
	if cw.content != nil && !cw.ours[rv] && !cw.superseded[rv] && cw.content.ResourceVersion != rv {
		key, err := objectKey(ref)
		if err != nil {
			return Changes{}, err
		}
		if _, err := w.readFresh(ctx, key, cw); err != nil {
			return Changes{}, err
		}
	}
	ch := cw.changes
	cw.changes = Changes{}
	if cw.content == nil {
		ch.All = true
	}
	return ch, nil
}

// Forget drops what the Writer knows of ref (the ConfigMap was deleted).
func (w *Writer) Forget(ref string) {
	cw := w.cmWriter(ref)
	cw.write.Lock()
	defer cw.write.Unlock()
	w.forgetLocked(cw)
}

// forgetLocked is Forget with cw.write held.
func (w *Writer) forgetLocked(cw *cmWriter) {
	cw.content, cw.superseded, cw.ours = nil, nil, nil
	cw.changes = Changes{}
}

// objectKey parses a "namespace/name" reference.
func objectKey(ref string) (client.ObjectKey, error) {
	ns, name, ok := strings.Cut(ref, "/")
	if !ok {
		return client.ObjectKey{}, fmt.Errorf("configmap reference %q is not ns/name", ref)
	}
	return client.ObjectKey{Namespace: ns, Name: name}, nil
}
