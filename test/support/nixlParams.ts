/**
 * A decode leg's `kv_transfer_params` as a vLLM prefill engine returns them (NixlConnector's fields:
 * vllm-project/vllm vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py, request_finished).
 */
export const PREFILL_PARAMS = {
  do_remote_prefill: true,
  do_remote_decode: false,
  remote_block_ids: [1, 2, 3],
  remote_engine_id: "engine-a",
  remote_request_id: "req-1",
  remote_host: "10.0.0.5",
  remote_port: 5600,
  tp_size: 1
}
