// Package informer is the controller's informer layer: it keeps the
// caches the controller reads current and says when they are.
//
//   - CacheCurrency (currency.go): every informer of the manager resumes
//     its watch by itself and, after a cut it cannot resume from, catches
//     up with a relist; reconciles wait while a cache is stale, and every
//     route is queued when they are all current again (Resync).
//   - PodCaches (podcache.go): one pod watcher per distinct (namespace,
//     label selector) that routes read, holding a record of each pod
//     (discovery.PodRecord), and the one source of their events.
//   - Indexer (indexer.go): the field indexes, each value kept once; Routes
//     (routes.go) looks routes up through them and maps an object's events
//     to the routes it concerns.
//
// It does not import internal/controller: the controller calls it.
package informer

// logName is the logger's name: the controller's (controller.Name).
const logName = "autoconfig"

// levelDebug is the logr V level of the debug messages.
const levelDebug = 1
