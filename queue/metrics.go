package queue

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// RegisterAll registers every collector of a backend on reg, or none: a
// store opened again on the same registerer (after a failed open) must be
// able to register its own. A nil reg registers nothing.
func RegisterAll(reg prometheus.Registerer, cs []prometheus.Collector) error {
	if reg == nil {
		return nil
	}
	for i, c := range cs {
		if err := reg.Register(c); err != nil {
			UnregisterAll(reg, cs[:i])
			return fmt.Errorf("register metrics: %w", err)
		}
	}
	return nil
}

// UnregisterAll takes the collectors off reg (nil: nothing to do); one that
// was never registered is passed over.
func UnregisterAll(reg prometheus.Registerer, cs []prometheus.Collector) {
	if reg == nil {
		return
	}
	for _, c := range cs {
		reg.Unregister(c)
	}
}

// DiskGauges are the sluice_log_disk_* gauges over a backend's usage: the
// same names in both backends (dashboards and alerts rely on them), with
// help texts saying what each backend measures.
func DiskGauges(usage func() DiskUsage, usedHelp, freeHelp, fullHelp string) []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_log_disk_used_bytes", Help: usedHelp},
			func() float64 { return float64(usage().Used) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_log_disk_free_bytes", Help: freeHelp},
			func() float64 { return float64(usage().Free) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_log_disk_full", Help: fullHelp},
			func() float64 {
				if usage().Full {
					return 1
				}
				return 0
			}),
	}
}
