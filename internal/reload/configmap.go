package reload

import (
	"context"
	"log/slog"
	"maps"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// ConfigMapSync is API mode's Source: it watches one ConfigMap and hands
// its keys to the Reloader, which writes them into --write-dir (so no
// write can happen between a check and the signal that follows it). The
// list/watch is restricted by the field selector metadata.name=<Name>,
// which the apiserver authorizes as a request for that one named object,
// so a Role with resourceNames: [<Name>] and verbs get, list, watch is
// enough.
type ConfigMapSync struct {
	Client    kubernetes.Interface
	Namespace string
	Name      string
	// Resync re-delivers the cached ConfigMap this often, so a write
	// that failed is tried again even if the ConfigMap never changes.
	Resync time.Duration
	Log    *slog.Logger
	// Synced is closed once the first content is on disk: /readyz turns
	// ready then.
	Synced chan struct{}

	once    sync.Once
	changed chan struct{}
	mu      sync.Mutex
	files   map[string][]byte
	version string
	listed  bool
	synced  sync.Once
}

var _ Source = (*ConfigMapSync)(nil)

func (s *ConfigMapSync) init() { s.once.Do(func() { s.changed = make(chan struct{}, 1) }) }

// Desired implements Source.
func (s *ConfigMapSync) Desired() (map[string][]byte, string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.files, s.version, s.listed
}

// Changed implements Source.
func (s *ConfigMapSync) Changed() <-chan struct{} { s.init(); return s.changed }

// Applied implements Source.
func (s *ConfigMapSync) Applied() {
	if s.Synced != nil {
		s.synced.Do(func() { close(s.Synced) })
	}
}

// Run syncs until ctx is done.
func (s *ConfigMapSync) Run(ctx context.Context) error {
	s.init()
	lw := cache.NewListWatchFromClient(s.Client.CoreV1().RESTClient(), "configmaps", s.Namespace,
		fields.OneTermEqualSelector("metadata.name", s.Name))
	_, ctrl := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &corev1.ConfigMap{},
		ResyncPeriod:  s.Resync,
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { s.update(obj) },
			UpdateFunc: func(_, obj any) { s.update(obj) },
			DeleteFunc: func(any) {
				// Like kubelet: a deleted ConfigMap does not empty the
				// directory (an empty route set would drop all traffic).
				s.Log.Warn("configmap deleted; keeping the last written content", "configmap", s.Namespace+"/"+s.Name)
			},
		},
	})
	s.Log.Info("watching configmap through the API", "configmap", s.Namespace+"/"+s.Name)
	ctrl.RunWithContext(ctx)
	return nil
}

func (s *ConfigMapSync) update(obj any) {
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok {
		return
	}
	files := make(map[string][]byte, len(cm.Data)+len(cm.BinaryData))
	maps.Copy(files, cm.BinaryData)
	for k, v := range cm.Data {
		files[k] = []byte(v)
	}
	v := ContentVersion(files)
	s.mu.Lock()
	same := s.listed && v == s.version
	s.files, s.version, s.listed = files, v, true
	s.mu.Unlock()
	log := s.Log.With("configmap", s.Namespace+"/"+s.Name, "resourceVersion", cm.ResourceVersion, "keys", len(files))
	if same {
		// A resync or a metadata-only update: nothing new to write, but a
		// failed write gets another try.
		log.Debug("configmap content unchanged")
	} else {
		log.Info("configmap content changed")
	}
	select {
	case s.changed <- struct{}{}:
	default:
	}
}
