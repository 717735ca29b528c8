// +k8s:deepcopy-gen=package

// Package routespec holds the ModelRoute spec types
// (routing.modelsphere.dev/v1alpha1) with no Kubernetes dependency, so the
// compiler can take them without pulling in apimachinery. The public API
// package schema/v1alpha1 aliases them (v1alpha1.Spec is routespec.Spec);
// users of the API import v1alpha1 only.
//
// The CUE schema in schema/ is the source of truth for fields, defaults and
// rules; these types mirror it, and crdgen's tests prove they match the CRD
// generated from it field by field.
//
// A Spec is meaningful to the compiler only after schema validation has
// filled its defaults (route name, priorities, video values, ...).
package routespec
