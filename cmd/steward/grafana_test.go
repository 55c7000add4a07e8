package main

import (
	"context"
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/publisher"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/workertest"
)

// dashboardFile is the Grafana dashboard shipped for the metrics.
const dashboardFile = "../../deploy/grafana/steward.json"

// recorder is a Registerer that remembers what was registered, so a
// vector with no child yet (nothing refused, nothing forged) still names
// its metric and labels through its Desc.
type recorder struct {
	prometheus.Registerer
	collectors []prometheus.Collector
}

func (r *recorder) Register(c prometheus.Collector) error {
	r.collectors = append(r.collectors, c)
	return r.Registerer.Register(c)
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

var (
	descName   = regexp.MustCompile(`fqName: "([^"]+)"`)
	descLabels = regexp.MustCompile(`variableLabels: \{([^}]*)\}\}$`)
)

// exportedMetrics registers what a steward process registers on the
// registry it serves on /metrics (newRegistry, the runtime of a worker,
// the ingress's publisher) and returns every series name it can export,
// with its label names. A histogram exports _bucket (with le), _sum and
// _count.
func exportedMetrics(t *testing.T) map[string][]string {
	t.Helper()
	reg := newRegistry()
	rec := &recorder{Registerer: reg}
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	spec := workers.Spec{Name: "credential", Instance: "hive-1", Subjects: []string{events.EventsPrefix + ".credential.rotated.hive-1"}, Types: []string{events.TypeCredentialRotated}}
	if _, err := workers.New(js, spec, workers.HandlerFunc(func(context.Context, *workers.Delivery) error { return nil }), workers.WithRegisterer(rec)); err != nil {
		t.Fatal(err)
	}
	publisher.New(js, publisher.WithRegisterer(rec))

	out := map[string][]string{}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		var labels []string
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if !slices.Contains(labels, l.GetName()) {
					labels = append(labels, l.GetName())
				}
			}
		}
		out[f.GetName()] = labels
		if f.GetType() == dto.MetricType_HISTOGRAM {
			out[f.GetName()+"_bucket"] = append(slices.Clone(labels), "le")
			out[f.GetName()+"_sum"], out[f.GetName()+"_count"] = labels, labels
		}
	}
	for _, c := range rec.collectors {
		ch := make(chan *prometheus.Desc, 16)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			s := d.String()
			name := descName.FindStringSubmatch(s)
			if name == nil {
				t.Fatalf("cannot read the metric name of %s", s)
			}
			if _, ok := out[name[1]]; ok {
				continue
			}
			var labels []string
			if l := descLabels.FindStringSubmatch(s); l != nil && l[1] != "" {
				labels = strings.Split(l[1], ",")
			}
			out[name[1]] = labels
		}
	}
	return out
}

var (
	// A series name in a PromQL expression: an identifier not followed by
	// "(" (a function) and not inside a label matcher or a by() list.
	promIdent   = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	promMatcher = regexp.MustCompile(`\{[^}]*\}`)
	promGroup   = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
	promLabel   = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
	promRange   = regexp.MustCompile(`\[[^\]]*\]`)
	promString  = regexp.MustCompile(`"[^"]*"`)
)

// promKeywords are the words of PromQL that are no series.
var promKeywords = []string{"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}

// seriesOf is each series an expression names, with the label names its
// matchers and groupings use on it.
func seriesOf(expr string) map[string][]string {
	out := map[string][]string{}
	var grouped []string
	for _, g := range promGroup.FindAllStringSubmatch(expr, -1) {
		for l := range strings.SplitSeq(g[1], ",") {
			grouped = append(grouped, strings.TrimSpace(l))
		}
	}
	bare := promGroup.ReplaceAllString(expr, " ")
	bare = promRange.ReplaceAllString(bare, " ")
	// Each selector: the name before a matcher, and the matcher's labels.
	for {
		loc := promMatcher.FindStringIndex(bare)
		if loc == nil {
			break
		}
		name := ""
		if ids := promIdent.FindAllString(bare[:loc[0]], -1); len(ids) > 0 && strings.HasSuffix(strings.TrimSpace(bare[:loc[0]]), ids[len(ids)-1]) {
			name = ids[len(ids)-1]
		}
		var labels []string
		for _, m := range promLabel.FindAllStringSubmatch(promString.ReplaceAllString(bare[loc[0]:loc[1]], `""`), -1) {
			labels = append(labels, m[1])
		}
		if name != "" {
			out[name] = append(out[name], labels...)
		}
		bare = bare[:loc[0]] + " " + bare[loc[1]:]
	}
	for _, loc := range promIdent.FindAllStringIndex(bare, -1) {
		id := bare[loc[0]:loc[1]]
		rest := strings.TrimLeft(bare[loc[1]:], " ")
		if strings.HasPrefix(rest, "(") || slices.Contains(promKeywords, id) || strings.HasPrefix(id, "$") {
			continue
		}
		if _, ok := out[id]; !ok && strings.ContainsRune(id, '_') {
			out[id] = nil
		}
	}
	for name := range out {
		out[name] = append(out[name], grouped...)
	}
	return out
}

// TestGrafanaDashboardLoads parses deploy/grafana/steward.json as Grafana
// reads it and checks that every series its queries and variables name is
// one a steward process exports, with labels it has, so no panel is empty
// because of a name the binary does not serve.
func TestGrafanaDashboardLoads(t *testing.T) {
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title      string `json:"title"`
		UID        string `json:"uid"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Type       string `json:"type"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	if err := dec.Decode(&dash); err != nil {
		t.Fatalf("%s is not JSON Grafana can read: %v", dashboardFile, err)
	}
	if dash.Title == "" || dash.UID == "" {
		t.Fatalf("%s has no title or uid", dashboardFile)
	}
	exported := exportedMetrics(t)
	// What Prometheus adds to every series it scrapes.
	target := []string{"job", "instance"}
	exprs := map[string]string{}
	for _, v := range dash.Templating.List {
		if v.Type == "query" {
			exprs["variable "+v.Name] = strings.TrimSuffix(strings.TrimPrefix(v.Definition, "label_values("), ")")
		}
	}
	queries := 0
	for _, p := range dash.Panels {
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for i, tg := range p.Targets {
			exprs[p.Title+" query "+string(rune('A'+i))] = tg.Expr
			queries++
		}
	}
	if queries < 10 {
		t.Fatalf("%d queries: the dashboard is not the one shipped", queries)
	}
	for where, expr := range exprs {
		series := seriesOf(expr)
		if len(series) == 0 {
			t.Errorf("%s names no series: %s", where, expr)
		}
		for name, labels := range series {
			have, ok := exported[name]
			if !ok {
				t.Errorf("%s: %s is no metric steward exports (%s)", where, name, expr)
				continue
			}
			for _, l := range labels {
				if !slices.Contains(have, l) && !slices.Contains(target, l) {
					t.Errorf("%s: %s has no label %q (it has %v)", where, name, l, have)
				}
			}
		}
	}
}
