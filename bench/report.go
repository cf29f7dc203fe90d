package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
)

// report is everything the run measured; it becomes the table and the
// JSON file.
type report struct {
	Command         []string                   `json:"command"`
	Machine         machine                    `json:"machine"`
	Options         map[string]any             `json:"options"`
	Sluice          string                     `json:"sluice_binary"`
	TotalSeconds    float64                    `json:"total_seconds"`
	ScenarioSeconds map[string]float64         `json:"scenario_seconds"`
	Rows            []*row                     `json:"rows"`
	Baselines       map[string]*baselineResult `json:"baselines"`
	Windows         []*window                  `json:"windows"`
	Sidecars        []*sidecarRecord           `json:"sidecars"`
	Extra           map[string]float64         `json:"extra,omitempty"`
	Details         map[string]any             `json:"details,omitempty"` // per scenario, for blackhole and outage
	Failures        []string                   `json:"failures,omitempty"`
}

// sidecarRecord is one sidecar process's life.
type sidecarRecord struct {
	Name          string   `json:"name"`
	Subscriptions int      `json:"subscriptions"`
	Durability    string   `json:"durability"`
	ConfigBytes   int64    `json:"config_bytes"`
	ReadySeconds  float64  `json:"ready_seconds"`
	StopSeconds   float64  `json:"stop_seconds"`
	Killed        bool     `json:"killed,omitempty"`
	Accepted      int64    `json:"events_accepted"`
	Delivered     int64    `json:"deliveries_received"`
	Log           []string `json:"log_warnings,omitempty"`
	// Fleet is set on the nodes of a fleet: their events_accepted and
	// deliveries_received are the fleet's (producers are spread over the
	// nodes and any owner delivers), the same on each node's record.
	Fleet bool `json:"fleet_totals,omitempty"`
}

func newReport(o *options) *report {
	return &report{
		Command: append([]string{"go", "run", "./bench"}, o.args...),
		Options: map[string]any{
			"scenarios": o.scenarios, "duration": o.duration.String(), "warmup": o.warmup.String(), "quick": o.quick,
			"lanes": o.lanes, "lanes_rate": o.lanesRate, "payload_rate": o.payloadRate, "paced_rate": o.pacedRate,
			"start_timeout": o.startTimeout.String(), "profile_dir": o.profileDir, "json": o.jsonPath,
			"lane_cap": laneCap, "body_bytes": 512, "ingest_producers": ingestProducers,
			"fanout_producers": fanoutProducers, "open_loop_workers": openWorkers,
		},
		ScenarioSeconds: map[string]float64{},
		Baselines:       map[string]*baselineResult{},
		Extra:           map[string]float64{},
		Details:         map[string]any{},
	}
}

// Where a target applies: to the value itself or to value/baseline.
const (
	onValue = "value"
	onRatio = "ratio"
)

// row is one line of the table.
type row struct {
	Scenario      string   `json:"scenario"`
	Metric        string   `json:"metric"`
	Value         float64  `json:"value"`
	Unit          string   `json:"unit,omitempty"`
	Baseline      string   `json:"baseline,omitempty"`
	BaselineValue *float64 `json:"baseline_value,omitempty"`
	Ratio         *float64 `json:"ratio,omitempty"`
	TargetOn      string   `json:"target_on,omitempty"`
	TargetOp      string   `json:"target_op,omitempty"`
	TargetLimit   *float64 `json:"target_limit,omitempty"`
	Pass          *bool    `json:"pass,omitempty"`
	Note          string   `json:"note,omitempty"`
	failed        string
}

func (r *report) add(scenario, metric string, value float64, unit string) *row {
	x := &row{Scenario: scenario, Metric: metric, Value: value, Unit: unit}
	r.Rows = append(r.Rows, x)
	return x
}

// fail records a scenario that could not run (or stopped) with its error.
func (r *report) fail(scenario string, err error) {
	r.Failures = append(r.Failures, scenario+": "+err.Error())
	f := false
	r.Rows = append(r.Rows, &row{Scenario: scenario, Metric: "error", Note: err.Error(), Pass: &f, failed: err.Error()})
}

// vs sets the baseline from a baseline result (nothing when it is missing).
func (x *row) vs(b *baselineResult, f func(*baselineResult) float64) *row {
	if b == nil || b.Err != "" {
		return x
	}
	return x.vsValue(b.Name, f(b))
}

func (x *row) vsValue(name string, v float64) *row {
	x.Baseline, x.BaselineValue = name, &v
	if v != 0 && !math.IsNaN(v) && !math.IsInf(v, 0) {
		r := x.Value / v
		x.Ratio = &r
	}
	return x
}

// want sets a target and evaluates it.
func (x *row) want(on, op string, limit float64) *row {
	x.TargetOn, x.TargetOp, x.TargetLimit = on, op, &limit
	x.eval()
	return x
}

// fail marks the row as failed whatever its value says.
func (x *row) fail(reason string) *row {
	x.failed = reason
	f := false
	x.Pass = &f
	if x.Note == "" {
		x.Note = reason
	} else {
		x.Note = reason + "; " + x.Note
	}
	return x
}

func (x *row) note(s string) *row {
	if x.Note == "" {
		x.Note = s
	} else {
		x.Note += "; " + s
	}
	return x
}

func (x *row) eval() {
	if x.TargetLimit == nil || x.failed != "" {
		return
	}
	v := &x.Value
	if x.TargetOn == onRatio {
		v = x.Ratio // nil without a baseline: fails
	}
	pass := false
	if v == nil {
		x.note("no baseline to compare with")
	} else if !math.IsNaN(*v) {
		switch x.TargetOp {
		case ">=":
			pass = *v >= *x.TargetLimit
		case "<=":
			pass = *v <= *x.TargetLimit
		}
	}
	x.Pass = &pass
}

func (x *row) targetString() string {
	if x.TargetLimit == nil {
		return ""
	}
	op := map[string]string{">=": "≥", "<=": "≤"}[x.TargetOp]
	if x.TargetOn == onRatio {
		return op + strconv.FormatFloat(*x.TargetLimit, 'f', -1, 64) + "×"
	}
	return op + fmtNum(*x.TargetLimit) + " " + x.Unit
}

func (x *row) result() string {
	switch {
	case x.Pass == nil:
		return ""
	case *x.Pass:
		return "pass"
	default:
		return "FAIL"
	}
}

// printTable writes the table, then failures and sidecar warnings.
func (r *report) printTable(w io.Writer) {
	m := r.Machine
	fmt.Fprintf(w, "\nsluice bench — %s, %d CPUs (%s), %.1f GiB, %s, commit %s\n", m.Date, m.CPUs, m.CPUModel,
		float64(m.MemTotalBytes)/(1<<30), m.GoVersion, m.Commit)
	fmt.Fprintf(w, "command: %s\n\n", strings.Join(r.Command, " "))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tMETRIC\tVALUE\tBASELINE\tRATIO\tTARGET\tRESULT\tNOTE")
	for _, x := range r.Rows {
		val := fmtNum(x.Value) + " " + x.Unit
		if x.Metric == "error" {
			val = ""
		}
		base := ""
		if x.BaselineValue != nil {
			base = fmtNum(*x.BaselineValue) + " (" + x.Baseline + ")"
		}
		ratio := ""
		if x.Ratio != nil {
			prec := 2
			if x.TargetLimit != nil && x.TargetOn == onRatio && math.Abs(*x.Ratio-*x.TargetLimit) < 0.01 {
				prec = 3 // do not print 0.50× next to a FAIL against ≥0.5×
			}
			ratio = strconv.FormatFloat(*x.Ratio, 'f', prec, 64) + "×"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", x.Scenario, x.Metric, val, base, ratio, x.targetString(), x.result(), x.Note)
	}
	tw.Flush()
	pass, fail := 0, 0
	for _, x := range r.Rows {
		if x.Pass != nil {
			if *x.Pass {
				pass++
			} else {
				fail++
			}
		}
	}
	fmt.Fprintf(w, "\ntargets: %d pass, %d fail; %.0f s in all\n", pass, fail, r.TotalSeconds)
	for _, f := range r.Failures {
		fmt.Fprintf(w, "failed: %s\n", f)
	}
	for _, s := range r.Sidecars {
		if len(s.Log) > 0 || s.Killed {
			fmt.Fprintf(w, "sidecar %s (%d subscriptions) logged:\n", s.Name, s.Subscriptions)
			for _, l := range s.Log {
				fmt.Fprintf(w, "  %s\n", l)
			}
			if s.Killed {
				fmt.Fprintf(w, "  (did not exit within 20 s of SIGTERM; killed)\n")
			}
		}
	}
}

func (r *report) writeJSON(path string) error {
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// fmtNum prints large numbers with thousands separators, small ones with
// two or three significant decimals.
func fmtNum(v float64) string {
	switch a := math.Abs(v); {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return "n/a"
	case a >= 1000:
		s := strconv.FormatInt(int64(math.Round(v)), 10)
		neg := strings.HasPrefix(s, "-")
		s = strings.TrimPrefix(s, "-")
		var b strings.Builder
		for i, c := range s {
			if i > 0 && (len(s)-i)%3 == 0 {
				b.WriteByte(',')
			}
			b.WriteRune(c)
		}
		if neg {
			return "-" + b.String()
		}
		return b.String()
	case a >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	default:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
}
