package scaler

import (
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func objectMeta(ns, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: ns, Name: name}
}

// isNotFound: the API server has no such resource (a CRD that is not
// installed can also answer 404 to a list).
func isNotFound(err error) bool { return apierrors.IsNotFound(err) }
