package hagate

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestLabelPatch(t *testing.T) {
	pod := func(labels map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", ResourceVersion: "42", Labels: labels}}
	}
	for name, tc := range map[string]struct {
		pod  *corev1.Pod
		key  string
		add  bool
		want string
	}{
		"add to nil labels": {pod(nil), "router-active", true,
			`[{"op":"test","path":"/metadata/resourceVersion","value":"42"},{"op":"add","path":"/metadata/labels","value":{"router-active":"true"}}]`},
		"add": {pod(map[string]string{"app": "router"}), "router-active", true,
			`[{"op":"test","path":"/metadata/resourceVersion","value":"42"},{"op":"add","path":"/metadata/labels/router-active","value":"true"}]`},
		"remove escaped": {pod(map[string]string{"x.io/r~a": "true"}), "x.io/r~a", false,
			`[{"op":"test","path":"/metadata/resourceVersion","value":"42"},{"op":"remove","path":"/metadata/labels/x.io~1r~0a"}]`},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := labelPatch(tc.pod, tc.key, tc.add)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Fatalf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
	if _, err := labelPatch(pod(nil), "router-active", false); err == nil {
		t.Fatal("removing an absent label must be an error, not a patch that fails on the server")
	}
}
