package reload

import "github.com/modelsphere/autoconfig/internal/served"

// SetReportForTest gives r's served reports to f, as New gives them to a
// PodReporter for --pod-name. For the tests of package reload_test, which
// run a real nginx through internal/nginxtest (a package that imports
// this one, so they cannot be in package reload).
func SetReportForTest(r *Reloader, f func(served.Report)) { r.report = f }
