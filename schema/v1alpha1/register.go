package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// SchemeGroupVersion is the group and version of the ModelRoute types.
var SchemeGroupVersion = schema.GroupVersion{Group: Group, Version: Version}

// Resource is the ModelRoute resource (plural name) in this group.
var Resource = SchemeGroupVersion.WithResource("modelroutes")

var (
	// SchemeBuilder registers the ModelRoute types with a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds ModelRoute and ModelRouteList to a scheme, e.g. the
	// controller manager's: utilruntime.Must(v1alpha1.AddToScheme(s)).
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(SchemeGroupVersion, &ModelRoute{}, &ModelRouteList{})
	metav1.AddToGroupVersion(s, SchemeGroupVersion)
	return nil
}
