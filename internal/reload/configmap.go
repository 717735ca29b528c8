package reload

import (
	"context"
	"log/slog"
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// ConfigMapSync is API mode: it watches one ConfigMap and writes its keys
// into Dir with WriteAtomic. The list/watch is restricted by the field
// selector metadata.name=<Name>, which the apiserver authorizes as a request
// for that one named object, so a Role with resourceNames: [<Name>] and
// verbs get, list, watch is enough.
type ConfigMapSync struct {
	Client    kubernetes.Interface
	Namespace string
	Name      string
	Dir       string
	Log       *slog.Logger
	Metrics   *Metrics
	Now       func() time.Time
	// Synced is closed after the first successful write (or when the
	// first listed content was already in Dir): /readyz turns ready then.
	Synced chan struct{}
}

// Run syncs until ctx is done.
func (s *ConfigMapSync) Run(ctx context.Context) error {
	if s.Now == nil {
		s.Now = time.Now
	}
	lw := cache.NewListWatchFromClient(s.Client.CoreV1().RESTClient(), "configmaps", s.Namespace,
		fields.OneTermEqualSelector("metadata.name", s.Name))
	_, ctrl := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &corev1.ConfigMap{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { s.write(obj) },
			UpdateFunc: func(_, obj any) { s.write(obj) },
			DeleteFunc: func(any) {
				// Like kubelet: a deleted ConfigMap does not empty the
				// directory (an empty route set would drop all traffic).
				s.Log.Warn("configmap deleted; keeping the last written content", "configmap", s.Namespace+"/"+s.Name)
			},
		},
	})
	s.Log.Info("watching configmap through the API", "configmap", s.Namespace+"/"+s.Name, "dir", s.Dir)
	ctrl.RunWithContext(ctx)
	return nil
}

func (s *ConfigMapSync) write(obj any) {
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok {
		return
	}
	files := make(map[string][]byte, len(cm.Data)+len(cm.BinaryData))
	maps.Copy(files, cm.BinaryData)
	for k, v := range cm.Data {
		files[k] = []byte(v)
	}
	changed, err := WriteAtomic(s.Dir, files, s.Now())
	log := s.Log.With("configmap", s.Namespace+"/"+s.Name, "resourceVersion", cm.ResourceVersion, "keys", len(files))
	switch {
	case err != nil:
		s.Metrics.ConfigMapWrites.WithLabelValues("error").Inc()
		log.Error("cannot write configmap keys", "dir", s.Dir, "err", err)
		return
	case changed:
		s.Metrics.ConfigMapWrites.WithLabelValues("written").Inc()
		s.Metrics.LastConfigMapWrite.Set(float64(s.Now().Unix()))
		log.Info("wrote configmap keys", "dir", s.Dir)
	default:
		s.Metrics.ConfigMapWrites.WithLabelValues("unchanged").Inc()
		log.Debug("configmap content unchanged")
	}
	if s.Synced != nil {
		select {
		case <-s.Synced:
		default:
			close(s.Synced)
		}
	}
}
