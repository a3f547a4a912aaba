// Package serverstats measures what a phase of a benchmark cost redis-server, the way
// bench/redis_server_stats.h does for ours: `INFO cpu` and `INFO commandstats` are read before
// and after the phase, and Print writes one line
//
//	server phase=P msgs=N secs=S cpu_s=C cpu_us_per_msg=U busy=B cmds_per_msg=K scripts_per_msg=E top=CMD:PER_MSG,...
//
// cpu is used_cpu_user + used_cpu_sys; busy = cpu / wall time of the phase; cmds counts every
// command the server ran (those run inside scripts included) except EVAL/EVALSHA/FCALL (counted
// as scripts) and INFO itself.
package serverstats

import (
	"context"
	"fmt"
	"log"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Snapshot is one reading of redis-server's counters.
type Snapshot struct {
	at    time.Time
	cpu   float64
	calls map[string]int64
}

// Take reads INFO cpu and INFO commandstats.
func Take(ctx context.Context, c redis.UniversalClient) Snapshot {
	text, err := c.Info(ctx, "cpu", "commandstats").Result()
	if err != nil {
		log.Fatalf("INFO: %v", err)
	}
	s := Snapshot{at: time.Now(), calls: map[string]int64{}}
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		key, value, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch {
		case key == "used_cpu_user" || key == "used_cpu_sys":
			v, _ := strconv.ParseFloat(value, 64)
			s.cpu += v
		case strings.HasPrefix(key, "cmdstat_"):
			calls, _, _ := strings.Cut(strings.TrimPrefix(value, "calls="), ",")
			n, _ := strconv.ParseInt(calls, 10, 64)
			s.calls[strings.TrimPrefix(key, "cmdstat_")] = n
		}
	}
	return s
}

func isScript(cmd string) bool {
	switch cmd {
	case "eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro":
		return true
	}
	return false
}

// Print writes the line for the phase from before to after, in which msgs messages settled.
func Print(phase string, msgs int, before, after Snapshot) {
	secs := after.at.Sub(before.at).Seconds()
	cpu := after.cpu - before.cpu
	type perCmd struct {
		name string
		n    int64
	}
	var cmds, scripts int64
	var all []perCmd
	for name, n := range after.calls {
		d := n - before.calls[name]
		if d <= 0 || name == "info" {
			continue
		}
		if isScript(name) {
			scripts += d
		} else {
			cmds += d
		}
		all = append(all, perCmd{name, d})
	}
	sort.Slice(all, func(i, j int) bool {
		if all[i].n != all[j].n {
			return all[i].n > all[j].n
		}
		return all[i].name < all[j].name
	})
	var top []string
	for i := 0; i < len(all) && i < 10; i++ {
		top = append(top, fmt.Sprintf("%s:%.2f", all[i].name, float64(all[i].n)/float64(msgs)))
	}
	fmt.Printf("server phase=%s msgs=%d secs=%.3f cpu_s=%.3f cpu_us_per_msg=%.1f busy=%.2f "+
		"cmds_per_msg=%.2f scripts_per_msg=%.3f top=%s\n", phase, msgs, secs, cpu,
		cpu*1e6/float64(msgs), cpu/secs, float64(cmds)/float64(msgs),
		float64(scripts)/float64(msgs), strings.Join(top, ","))
}
