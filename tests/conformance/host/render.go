package main

// Rendering of protocol messages into plain JSON values for events.

import (
	"sort"

	devicepb "lingjunconf/pb/device"
	structspb "lingjunconf/pb/structs"
)

func renderAttribute(a *structspb.Attribute) map[string]interface{} {
	out := map[string]interface{}{"unit": a.GetUnit()}
	switch v := a.GetValue().(type) {
	case *structspb.Attribute_FloatVal:
		out["value"], out["kind"] = v.FloatVal, "float"
	case *structspb.Attribute_IntVal:
		out["value"], out["kind"] = v.IntVal, "int"
	case *structspb.Attribute_StringVal:
		out["value"], out["kind"] = v.StringVal, "string"
	case *structspb.Attribute_BoolVal:
		out["value"], out["kind"] = v.BoolVal, "bool"
	default:
		out["value"], out["kind"] = nil, "none"
	}
	return out
}

func renderFingerprint(resp *devicepb.FingerprintResponse) []interface{} {
	groups := []interface{}{}
	for _, g := range resp.GetDeviceGroup() {
		attrs := map[string]interface{}{}
		for k, a := range g.GetAttributes() {
			attrs[k] = renderAttribute(a)
		}
		devs := []interface{}{}
		for _, d := range g.GetDevices() {
			devs = append(devs, map[string]interface{}{
				"id":                 d.GetID(),
				"healthy":            d.GetHealthy(),
				"health_description": d.GetHealthDescription(),
				"pci_bus_id":         d.GetHwLocality().GetPciBusId(),
			})
		}
		groups = append(groups, map[string]interface{}{
			"vendor": g.GetVendor(), "type": g.GetDeviceType(), "name": g.GetDeviceName(),
			"attributes": attrs, "devices": devs,
		})
	}
	return groups
}

func renderStatValue(v *structspb.StatValue) map[string]interface{} {
	if v == nil {
		return nil
	}
	out := map[string]interface{}{}
	if x := v.GetFloatNumeratorVal(); x != nil {
		out["float_numerator"] = x.GetValue()
	}
	if x := v.GetFloatDenominatorVal(); x != nil {
		out["float_denominator"] = x.GetValue()
	}
	if x := v.GetIntNumeratorVal(); x != nil {
		out["int_numerator"] = x.GetValue()
	}
	if x := v.GetIntDenominatorVal(); x != nil {
		out["int_denominator"] = x.GetValue()
	}
	if x := v.GetStringVal(); x != nil {
		out["string"] = x.GetValue()
	}
	if x := v.GetBoolVal(); x != nil {
		out["bool"] = x.GetValue()
	}
	if v.GetUnit() != "" {
		out["unit"] = v.GetUnit()
	}
	if v.GetDesc() != "" {
		out["desc"] = v.GetDesc()
	}
	return out
}

// flattenStatObject flattens nested objects with "." like `nomad node
// status -stats` does.
func flattenStatObject(prefix string, o *structspb.StatObject, out map[string]interface{}) {
	if o == nil {
		return
	}
	for k, v := range o.GetAttributes() {
		out[prefix+k] = renderStatValue(v)
	}
	for k, n := range o.GetNested() {
		flattenStatObject(prefix+k+".", n, out)
	}
}

func renderStats(resp *devicepb.StatsResponse, detail bool) ([]interface{}, int) {
	groups := []interface{}{}
	total := 0
	for _, g := range resp.GetGroups() {
		ids := make([]string, 0, len(g.GetInstanceStats()))
		for id := range g.GetInstanceStats() {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		inst := map[string]interface{}{}
		for _, id := range ids {
			s := g.GetInstanceStats()[id]
			rec := map[string]interface{}{"summary": renderStatValue(s.GetSummary())}
			if ts := s.GetTimestamp(); ts != nil {
				rec["timestamp_unix_ns"] = ts.GetSeconds()*1e9 + int64(ts.GetNanos())
			}
			flat := map[string]interface{}{}
			flattenStatObject("", s.GetStats(), flat)
			rec["n_stats"] = len(flat)
			if detail {
				rec["stats"] = flat
			}
			inst[id] = rec
		}
		total += len(ids)
		groups = append(groups, map[string]interface{}{
			"vendor": g.GetVendor(), "type": g.GetType(), "name": g.GetName(), "instances": inst,
		})
	}
	return groups, total
}

func renderReservation(resp *devicepb.ReserveResponse) map[string]interface{} {
	cr := resp.GetContainerRes()
	out := map[string]interface{}{"container_res": cr != nil}
	envs := map[string]string{}
	for k, v := range cr.GetEnvs() {
		envs[k] = v
	}
	devs := []interface{}{}
	for _, d := range cr.GetDevices() {
		devs = append(devs, map[string]interface{}{"task_path": d.GetTaskPath(), "host_path": d.GetHostPath(), "permissions": d.GetPermissions()})
	}
	mounts := []interface{}{}
	for _, m := range cr.GetMounts() {
		mounts = append(mounts, map[string]interface{}{"task_path": m.GetTaskPath(), "host_path": m.GetHostPath(), "read_only": m.GetReadOnly()})
	}
	out["envs"], out["devices"], out["mounts"] = envs, devs, mounts
	return out
}
