package console

import (
	"fmt"
	"strings"

	"github.com/steward-dev/steward/internal/ops"
)

// chart is one small inline SVG chart of the last hour, laid out here so
// the template only draws: the overview's backlog line and its
// per-minute bars. No script draws it, so it shows with scripts off and
// under the console's CSP.
type chart struct {
	ID, Title string
	Width     int
	Height    int
	// Max is the top of the scale (at least 1), Peak the largest value
	// drawn and Last the newest minute's.
	Max, Peak, Last uint64
	// Line is a polyline's points; Bars are rectangles (two series side
	// by side when Series has two names).
	Line   string
	Bars   []bar
	Series []string
	// Points counts the minutes drawn, for tests and screen readers.
	Points int
	From   string
	To     string
}

// bar is one rectangle of a bar chart, with the title a pointer shows.
type bar struct {
	X, Y, W, H int
	Class      string
	Title      string
}

const (
	chartWidth  = 480
	chartHeight = 90
)

// charts lays out the overview's two charts from ops.GetActivity.
func charts(a *ops.Activity) []chart {
	if a == nil || len(a.Minutes) == 0 {
		return nil
	}
	n := len(a.Minutes)
	from, to := a.Minutes[0].Start.Format("15:04Z"), a.Minutes[n-1].Start.Format("15:04Z")
	backlog := chart{ID: "chart-backlog", Title: "Backlog", Width: chartWidth, Height: chartHeight,
		Max: max(a.MaxBacklog, 1), Peak: a.MaxBacklog, Last: a.Minutes[n-1].Backlog, Points: n, From: from, To: to}
	var pts []string
	step := float64(chartWidth) / float64(max(n-1, 1))
	for i, m := range a.Minutes {
		y := float64(chartHeight) - float64(m.Backlog)/float64(backlog.Max)*float64(chartHeight-4) - 2
		pts = append(pts, fmt.Sprintf("%.1f,%.1f", float64(i)*step, y))
	}
	backlog.Line = strings.Join(pts, " ")

	rate := chart{ID: "chart-rate", Title: "Per minute", Width: chartWidth, Height: chartHeight,
		Max: max(a.MaxRate, 1), Peak: a.MaxRate, Last: a.Minutes[n-1].Settled, Points: n, From: from, To: to,
		Series: []string{"stored", "settled"}}
	slot := chartWidth / n
	w := max(1, slot/2-1)
	for i, m := range a.Minutes {
		at := m.Start.Format("15:04Z")
		for j, v := range []uint64{m.Stored, m.Settled} {
			h := int(float64(v) / float64(rate.Max) * float64(chartHeight-2))
			if v > 0 && h == 0 {
				h = 1
			}
			rate.Bars = append(rate.Bars, bar{X: i*slot + j*(w+1), Y: chartHeight - h, W: w, H: h, Class: "bar-" + rate.Series[j],
				Title: fmt.Sprintf("%s: %d %s", at, v, rate.Series[j])})
		}
	}
	return []chart{backlog, rate}
}
