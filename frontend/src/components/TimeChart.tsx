import { useEffect, useRef } from "react";
import uPlot from "uplot";
import { percentTicks } from "../lib/metrics";

/** A live time series (uPlot): `data` is [times, ...series]; redrawn in place on each update.
 * `fraction`: the series are fractions, drawn on a fixed 0–100% axis. */
export function TimeChart({
  title,
  labels,
  data,
  fraction = false,
}: {
  title: string;
  labels: string[];
  data: (number | null)[][];
  fraction?: boolean;
}) {
  const host = useRef<HTMLDivElement>(null);
  const plot = useRef<uPlot | null>(null);
  useEffect(() => {
    if (!host.current) return;
    const colors = ["#2f6fd6", "#d6762f", "#2fa36b"];
    plot.current = new uPlot(
      {
        title,
        width: 360,
        height: 170,
        series: [{}, ...labels.map((label, i) => ({ label, stroke: colors[i % colors.length], points: { show: true, size: 4 } }))],
        axes: [{}, fraction ? { size: 50, values: (_u: uPlot, splits: number[]) => percentTicks(splits) } : { size: 50 }],
        scales: fraction ? { y: { range: [0, 1] } } : {},
      },
      data as uPlot.AlignedData,
      host.current,
    );
    return () => plot.current?.destroy();
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [title, labels.join("|"), fraction]);
  useEffect(() => {
    plot.current?.setData(data as uPlot.AlignedData);
  }, [data]);
  return <div ref={host} className="chart" data-points={data[0]?.length ?? 0} aria-label={title} />;
}
