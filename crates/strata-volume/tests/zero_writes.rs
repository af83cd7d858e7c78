//! WRITEs of all-zero data are recorded as holes, whatever the volume's
//! settings: they read back as zeros, show as holes, cost no stored bytes,
//! and a zero write over data frees it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;
use strata_volume::{Allocation, Engine};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_zero_writes_become_holes_on_every_backend() {
    for (backend, store, dir) in backends().await {
        let engine = Engine::new(store.clone(), small_config(dir.path())).unwrap();
        engine.create_volume("v", VOLUME_BYTES).await.unwrap();
        let vol = engine.open_volume("v").await.unwrap();
        vol.write(0, &vec![0x5a; MIB as usize], false)
            .await
            .unwrap();
        vol.write(0, &vec![0; MIB as usize], false).await.unwrap();
        vol.write(4 * MIB, &vec![0; 4096], false).await.unwrap();
        vol.write(4 * MIB + 4096, &[0, 0, 1], false).await.unwrap();
        vol.flush().await.unwrap();
        let mut buf = vec![0xffu8; MIB as usize];
        vol.read(0, &mut buf).await.unwrap();
        assert!(buf.iter().all(|&b| b == 0), "{backend}: zeros read back");
        let map = vol.block_status(0, 8 * MIB, 16).unwrap();
        assert_eq!(
            map[0],
            (4 * MIB + 4096, Allocation::Hole),
            "{backend}: {map:?}"
        );
        assert_eq!(map[1], (3, Allocation::Data), "{backend}: {map:?}");
        let stats = vol.stats();
        assert_eq!(stats.zero_write_bytes_elided, MIB + 4096, "{backend}");
        assert_eq!(stats.mapped_data_bytes, 3, "{backend}");
        vol.close().await.unwrap();
    }
}
