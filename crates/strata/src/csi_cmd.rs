//! `strata csi`: the NBD server of `strata serve`, volumes opened on
//! demand, with the CSI endpoint (strata-csi) beside it. The endpoint is
//! bound before anything is served: a bad `--endpoint` stops here.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context};
use strata_volume::Engine;

use crate::cli::CsiArgs;
use crate::serve::{self, OpenAtStart};

pub async fn run(
    engine: Engine,
    args: &CsiArgs,
    local_store: Option<PathBuf>,
) -> anyhow::Result<()> {
    let endpoint =
        strata_csi::Endpoint::parse(&args.endpoint).map_err(|e| anyhow!("--endpoint: {e}"))?;
    if args.serve.loop_dir.is_some() {
        bail!("--loop-dir is for strata serve: the CSI node attaches each volume when kubelet stages it");
    }
    let node_id = args.node_id.trim();
    if node_id.is_empty() {
        bail!("--node-id is empty: give this node's name as Kubernetes knows it (the pod's spec.nodeName)");
    }
    let (controller, node) = match (args.controller, args.node) {
        (false, false) => (true, true),
        given => given,
    };
    let engine = Arc::new(engine);
    let config = strata_csi::DriverConfig {
        endpoint,
        node_id: node_id.to_string(),
        controller,
        node,
        local_store: if engine.store().is_local() {
            local_store
        } else {
            None
        },
        parse_qos: crate::qos_spec::parse_qos,
        default_fs_type: args.default_fs_type.clone(),
    };
    let bound = strata_csi::bind(config)?;
    let csi = tokio::spawn(bound.serve(engine.clone(), serve::shutdown_signal()));
    let served = serve::serve(engine, &args.serve, Vec::new(), OpenAtStart::OnDemand).await;
    if served.is_err() {
        csi.abort();
        return served;
    }
    csi.await.context("the CSI endpoint's task failed")?
}
