// Package celcheck validates custom resources against a CRD in-process,
// the way the API server does on create: CRD validation (structural
// schema, CEL compilation and cost), pruning with unknown fields reported
// (as fieldValidation=Strict does), OpenAPI schema validation and CEL
// x-kubernetes-validations, plus the object metadata checks. It is a fast
// second judge; the real API server (envtest) stays the final one.
package celcheck

import (
	"context"
	"fmt"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	crdvalidation "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	schemaobjectmeta "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/objectmeta"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
)

// Validator checks objects of one CRD version.
type Validator struct {
	apiVersion, kind string
	namespaced       bool
	structural       *structuralschema.Structural
	schema           validation.SchemaValidator
	cel              *cel.Validator
}

// New validates the CRD itself (as the API server does when it is
// created, including CEL cost estimates) and prepares a validator for its
// storage version.
func New(crd *apiextv1.CustomResourceDefinition) (*Validator, error) {
	var in apiextensions.CustomResourceDefinition
	if err := apiextv1.Convert_v1_CustomResourceDefinition_To_apiextensions_CustomResourceDefinition(crd, &in, nil); err != nil {
		return nil, fmt.Errorf("convert crd: %w", err)
	}
	// The API server records the storage version on create, before it
	// validates; do the same.
	in.Status.StoredVersions = nil
	for _, v := range in.Spec.Versions {
		if v.Storage {
			in.Status.StoredVersions = append(in.Status.StoredVersions, v.Name)
		}
	}
	if errs := crdvalidation.ValidateCustomResourceDefinition(context.Background(), &in); len(errs) > 0 {
		return nil, fmt.Errorf("invalid crd: %w", errs.ToAggregate())
	}
	var ver *apiextensions.CustomResourceDefinitionVersion
	for i := range in.Spec.Versions {
		if in.Spec.Versions[i].Storage {
			ver = &in.Spec.Versions[i]
		}
	}
	if ver == nil {
		return nil, fmt.Errorf("crd has no storage version")
	}
	props := in.Spec.Validation
	if ver.Schema != nil {
		props = ver.Schema
	}
	if props == nil || props.OpenAPIV3Schema == nil {
		return nil, fmt.Errorf("crd version %s has no schema", ver.Name)
	}
	s, err := structuralschema.NewStructural(props.OpenAPIV3Schema)
	if err != nil {
		return nil, fmt.Errorf("structural schema: %w", err)
	}
	sv, _, err := validation.NewSchemaValidator(props.OpenAPIV3Schema)
	if err != nil {
		return nil, fmt.Errorf("schema validator: %w", err)
	}
	return &Validator{
		apiVersion: in.Spec.Group + "/" + ver.Name,
		kind:       in.Spec.Names.Kind,
		namespaced: in.Spec.Scope == apiextensions.NamespaceScoped,
		structural: s,
		schema:     sv,
		cel:        cel.NewValidator(s, true, celconfig.PerCallLimit),
	}, nil
}

// Validate returns every reason the API server would reject obj on
// create. obj is modified (pruned) in place; decode it with integers kept
// as int64 (sigs.k8s.io/yaml.YAMLToJSON + unstructured), not float64.
func (v *Validator) Validate(ctx context.Context, obj map[string]any) field.ErrorList {
	var errs field.ErrorList
	u := &unstructured.Unstructured{Object: obj}
	if u.GetAPIVersion() != v.apiVersion {
		errs = append(errs, field.Invalid(field.NewPath("apiVersion"), u.GetAPIVersion(), "must be "+v.apiVersion))
	}
	if u.GetKind() != v.kind {
		errs = append(errs, field.Invalid(field.NewPath("kind"), u.GetKind(), "must be "+v.kind))
	}
	// Metadata is decoded strictly into ObjectMeta, as the API server
	// does: wrong types (a number label) and unknown fields are errors.
	meta, _, unknownMeta, err := schemaobjectmeta.GetObjectMetaWithOptions(obj, schemaobjectmeta.ObjectMetaOptions{ReturnUnknownFieldPaths: true})
	switch {
	case err != nil:
		errs = append(errs, field.Invalid(field.NewPath("metadata"), nil, err.Error()))
	case meta == nil:
		errs = append(errs, field.Required(field.NewPath("metadata"), ""))
	default:
		for _, p := range unknownMeta {
			errs = append(errs, field.Invalid(field.NewPath(p), nil, "unknown field"))
		}
		// The API server fills the request's namespace in; mirror it so a
		// namespaced object without one is judged like a kubectl create.
		if v.namespaced && meta.Namespace == "" {
			meta.Namespace = "default"
		}
		// The API server names an object from generateName before it
		// validates (five random characters; any valid ones will do).
		if meta.Name == "" && meta.GenerateName != "" {
			meta.Name = meta.GenerateName + "x0x0x"
			unstructured.SetNestedField(obj, meta.Name, "metadata", "name")
		}
		errs = append(errs, apivalidation.ValidateObjectMetaAccessor(meta, v.namespaced, apivalidation.NameIsDNSSubdomain, field.NewPath("metadata"))...)
	}

	// Then the same steps as the API server's decoder and create
	// strategy: prune (unknown fields are errors under
	// fieldValidation=Strict), drop nulls of non-nullable fields, validate
	// the OpenAPI schema, run the CEL rules.
	opts := structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true}
	for _, p := range pruning.PruneWithOptions(obj, v.structural, true, opts) {
		errs = append(errs, field.Invalid(field.NewPath(p), nil, "unknown field"))
	}
	defaulting.PruneNonNullableNullsWithoutDefaults(obj, v.structural)
	errs = append(errs, validation.ValidateCustomResource(nil, obj, v.schema)...)
	if v.cel != nil {
		celErrs, _ := v.cel.Validate(ctx, nil, v.structural, obj, nil, celconfig.RuntimeCELCostBudget)
		errs = append(errs, celErrs...)
	}
	return errs
}
