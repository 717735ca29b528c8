// Hand-written deep copies (the shape controller-gen would generate).
// TestDeepCopyIsDeep fills every field and fails when a new pointer, slice
// or map field is shared between a copy and its original, so a field added
// to types.go without a copy here is caught.

package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// DeepCopyInto copies in into out.
func (in *ModelRoute) DeepCopyInto(out *ModelRoute) {
	*out = *in
	out.TypeMeta = in.TypeMeta
	in.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	in.Spec.DeepCopyInto(&out.Spec)
	in.Status.DeepCopyInto(&out.Status)
}

// DeepCopy returns a deep copy.
func (in *ModelRoute) DeepCopy() *ModelRoute {
	if in == nil {
		return nil
	}
	out := new(ModelRoute)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (in *ModelRoute) DeepCopyObject() runtime.Object {
	if c := in.DeepCopy(); c != nil {
		return c
	}
	return nil
}

// DeepCopyInto copies in into out.
func (in *ModelRouteList) DeepCopyInto(out *ModelRouteList) {
	*out = *in
	out.TypeMeta = in.TypeMeta
	in.ListMeta.DeepCopyInto(&out.ListMeta)
	if in.Items != nil {
		out.Items = make([]ModelRoute, len(in.Items))
		for i := range in.Items {
			in.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
}

// DeepCopy returns a deep copy.
func (in *ModelRouteList) DeepCopy() *ModelRouteList {
	if in == nil {
		return nil
	}
	out := new(ModelRouteList)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (in *ModelRouteList) DeepCopyObject() runtime.Object {
	if c := in.DeepCopy(); c != nil {
		return c
	}
	return nil
}

// DeepCopyInto copies in into out.
func (in *Spec) DeepCopyInto(out *Spec) {
	*out = *in
	out.Discovery = in.Discovery
	if in.Cart != nil {
		out.Cart = in.Cart.DeepCopy()
	}
	in.Nginx.DeepCopyInto(&out.Nginx)
	if in.Monitor != nil {
		out.Monitor = in.Monitor.DeepCopy()
	}
	if in.SLO != nil {
		out.SLO = in.SLO.DeepCopy()
	}
}

// DeepCopy returns a deep copy.
func (in *Spec) DeepCopy() *Spec {
	if in == nil {
		return nil
	}
	out := new(Spec)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyInto copies in into out.
func (in *Discovery) DeepCopyInto(out *Discovery) { *out = *in }

// DeepCopy returns a deep copy.
func (in *Discovery) DeepCopy() *Discovery {
	if in == nil {
		return nil
	}
	out := new(Discovery)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyInto copies in into out.
func (in *Cart) DeepCopyInto(out *Cart) {
	*out = *in
	out.Discovery = in.Discovery
}

// DeepCopy returns a deep copy.
func (in *Cart) DeepCopy() *Cart {
	if in == nil {
		return nil
	}
	out := new(Cart)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyInto copies in into out.
func (in *Nginx) DeepCopyInto(out *Nginx) {
	*out = *in
	if in.Peers != nil {
		out.Peers = make([]Peer, len(in.Peers))
		copy(out.Peers, in.Peers)
	}
	if in.Values != nil {
		out.Values = make(map[string]string, len(in.Values))
		for k, v := range in.Values {
			out.Values[k] = v
		}
	}
}

// DeepCopy returns a deep copy.
func (in *Nginx) DeepCopy() *Nginx {
	if in == nil {
		return nil
	}
	out := new(Nginx)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyInto copies in into out.
func (in *Peer) DeepCopyInto(out *Peer) { *out = *in }

// DeepCopy returns a deep copy.
func (in *Peer) DeepCopy() *Peer {
	if in == nil {
		return nil
	}
	out := new(Peer)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyInto copies in into out.
func (in *Monitor) DeepCopyInto(out *Monitor) {
	*out = *in
	if in.Nginx != nil {
		b := *in.Nginx
		out.Nginx = &b
	}
	if in.Router != nil {
		b := *in.Router
		out.Router = &b
	}
}

// DeepCopy returns a deep copy.
func (in *Monitor) DeepCopy() *Monitor {
	if in == nil {
		return nil
	}
	out := new(Monitor)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyInto copies in into out.
func (in *SLO) DeepCopyInto(out *SLO) { *out = *in }

// DeepCopy returns a deep copy.
func (in *SLO) DeepCopy() *SLO {
	if in == nil {
		return nil
	}
	out := new(SLO)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyInto copies in into out.
func (in *Status) DeepCopyInto(out *Status) {
	*out = *in
	if in.BackendEndpoints != nil {
		out.BackendEndpoints = make([]string, len(in.BackendEndpoints))
		copy(out.BackendEndpoints, in.BackendEndpoints)
	}
	if in.Conditions != nil {
		out.Conditions = make([]metav1.Condition, len(in.Conditions))
		for i := range in.Conditions {
			in.Conditions[i].DeepCopyInto(&out.Conditions[i])
		}
	}
	if in.Outputs != nil {
		out.Outputs = make([]OutputKeys, len(in.Outputs))
		for i := range in.Outputs {
			in.Outputs[i].DeepCopyInto(&out.Outputs[i])
		}
	}
}

// DeepCopyInto copies in into out.
func (in *OutputKeys) DeepCopyInto(out *OutputKeys) {
	*out = *in
	if in.Keys != nil {
		out.Keys = make([]string, len(in.Keys))
		copy(out.Keys, in.Keys)
	}
}

// DeepCopy returns a deep copy.
func (in *Status) DeepCopy() *Status {
	if in == nil {
		return nil
	}
	out := new(Status)
	in.DeepCopyInto(out)
	return out
}
