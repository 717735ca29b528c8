// +k8s:deepcopy-gen=package
// +groupName=routing.modelsphere.dev

// Package v1alpha1 is the public Go API of the ModelRoute resource
// (routing.modelsphere.dev/v1alpha1): the resource, its list and status,
// and scheme registration. The spec types are declared in schema/routespec
// (free of apimachinery, so the compiler can take them) and aliased here,
// so importers of the API need this package only.
//
// The CUE schema in schema/ is the source of truth for fields, defaults and
// rules; these types mirror it and crdgen's tests prove they match the CRD
// generated from it.
package v1alpha1
