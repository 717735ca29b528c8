package v1alpha1_test

import (
	"reflect"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/randfill"

	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// TestDeepCopyIsDeep fills every field (no nils, non-empty slices and
// maps), copies, and requires an equal value that shares no pointer, slice
// or map with the original.
func TestDeepCopyIsDeep(t *testing.T) {
	f := randfill.New().NilChance(0).NumElements(1, 3)
	for i := 0; i < 50; i++ {
		var in v1alpha1.ModelRoute
		f.Fill(&in)
		out := in.DeepCopy()
		if !reflect.DeepEqual(&in, out) {
			t.Fatalf("copy differs from original")
		}
		assertNoAlias(t, "ModelRoute", reflect.ValueOf(in), reflect.ValueOf(*out))

		list := v1alpha1.ModelRouteList{Items: []v1alpha1.ModelRoute{in}}
		f.Fill(&list.ListMeta)
		lc := list.DeepCopyObject().(*v1alpha1.ModelRouteList)
		if !reflect.DeepEqual(&list, lc) {
			t.Fatalf("list copy differs from original")
		}
		assertNoAlias(t, "ModelRouteList", reflect.ValueOf(list), reflect.ValueOf(*lc))
	}
	var nilRoute *v1alpha1.ModelRoute
	if nilRoute.DeepCopy() != nil {
		t.Error("DeepCopy of nil is not nil")
	}
	var _ runtime.Object = &v1alpha1.ModelRoute{}
}

var timeType = reflect.TypeOf(time.Time{})

func assertNoAlias(t *testing.T, path string, a, b reflect.Value) {
	t.Helper()
	switch a.Kind() {
	case reflect.Pointer:
		if a.IsNil() {
			return
		}
		if a.Pointer() == b.Pointer() {
			t.Errorf("%s: pointer shared between copy and original", path)
			return
		}
		assertNoAlias(t, path, a.Elem(), b.Elem())
	case reflect.Slice:
		if a.Len() == 0 {
			return
		}
		if a.Pointer() == b.Pointer() {
			t.Errorf("%s: slice shared between copy and original", path)
			return
		}
		for i := 0; i < a.Len(); i++ {
			assertNoAlias(t, path+"[]", a.Index(i), b.Index(i))
		}
	case reflect.Map:
		if a.Len() == 0 {
			return
		}
		if a.Pointer() == b.Pointer() {
			t.Errorf("%s: map shared between copy and original", path)
			return
		}
		for _, k := range a.MapKeys() {
			assertNoAlias(t, path+"[k]", a.MapIndex(k), b.MapIndex(k))
		}
	case reflect.Struct:
		if a.Type() == timeType {
			return // time.Time shares its *Location by design
		}
		for i := 0; i < a.NumField(); i++ {
			if !a.Type().Field(i).IsExported() {
				continue
			}
			assertNoAlias(t, path+"."+a.Type().Field(i).Name, a.Field(i), b.Field(i))
		}
	}
}
